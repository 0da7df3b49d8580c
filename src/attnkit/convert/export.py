"""``attnkit export``: a checkpoint as a folder another tool loads as it is.

``--to hf``: a folder HF transformers' ``from_pretrained`` reads, for each Transformer architecture:
``config.json``, ``model.safetensors`` (the converter's state dict) and the tokenizer (``tokenizer.json``
and a ``tokenizer_config.json`` naming its special tokens, for ``PreTrainedTokenizerFast``); the tokenizer
adds no special tokens, so inputs are built as attnkit builds them.

- An encoder-decoder becomes a ``MarianMTModel``, with a ``generation_config.json`` of attnkit's decoding
  (start from ``<s>``, never produce ``<pad>`` or ``<s>``, stop at ``</s>``). A model with the paper's
  interleaved sinusoids is first turned into the equivalent one with Marian's concatenated layout
  (``with_concatenated_sinusoids``). Append ``eos_token_id`` to each source's ids.
- A decoder (GPT-style) becomes a ``GPT2LMHeadModel``; prompts are its tokens, as in ``attnkit generate``.
- An encoder (BERT-style) becomes the ``Bert...`` class of its head (``BertForSequenceClassification``
  with the run's label names as ``id2label``, ...); a sentence is ``[CLS]`` + its tokens + ``[SEP]``.

``--to ctranslate2``: a CTranslate2 model folder (``convert/ctranslate2.py``; the optional extra
``ctranslate2``) plus attnkit's ``tokenizer.json`` and the run's decoding settings
(``attnkit_decode.json``): a translation model for ``attnkit translate --engine ctranslate2``, a
GPT-style decoder for ``attnkit generate --engine ctranslate2``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from safetensors.torch import save_file
from torch import nn

from attnkit.checkpoint.ctranslate2_folder import DECODE_FILE, MODEL_FILE
from attnkit.convert.bert import HF_CLASS, hf_bert_config_kwargs, to_hf_bert
from attnkit.convert.ctranslate2 import ctranslate2_spec
from attnkit.convert.gpt2 import hf_gpt2_config_kwargs, to_hf_gpt2
from attnkit.convert.marian import hf_marian_config_kwargs, to_hf_marian, with_concatenated_sinusoids
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import ConversionError
from attnkit.folders import MadeBy, write_folder
from attnkit.models.decoder_only import DecoderModel
from attnkit.models.encoder_only import EncoderModel
from attnkit.models.seq2seq import EncoderDecoder
from attnkit.utf8 import native_path

# what made an export of a model the caller holds rather than a checkpoint's (the CLI names the checkpoint)
IN_MEMORY = MadeBy("attnkit export")


def hf_marian_files(model: EncoderDecoder, tokenizer: Tokenizer) -> dict[str, str | dict]:
    """The JSON files of the export (name -> content) and, under ``"weights"``, the state dict."""
    model = with_concatenated_sinusoids(model)
    s = tokenizer.specials
    config = {
        "model_type": "marian",
        "architectures": ["MarianMTModel"],
        **hf_marian_config_kwargs(model),
        "bos_token_id": s.bos,
        "eos_token_id": s.eos,
        "forced_eos_token_id": s.eos,
        "decoder_start_token_id": s.bos,  # attnkit's decoder starts from <s> (Marian's own from <pad>)
    }
    generation = {
        "bos_token_id": s.bos,
        "eos_token_id": s.eos,
        "pad_token_id": s.pad,
        "decoder_start_token_id": s.bos,
        "bad_words_ids": [[s.pad], [s.bos]],  # as attnkit's search, which never produces them
        "max_length": model.config.max_len,
        "num_beams": 1,
    }
    return {
        "config.json": config,
        "generation_config.json": generation,
        "tokenizer_config.json": _tokenizer_config(tokenizer, model.config.max_len),
        "tokenizer.json": tokenizer.to_str(),
        "weights": to_hf_marian(model),
    }


def hf_gpt2_files(model: DecoderModel, tokenizer: Tokenizer) -> dict[str, str | dict]:
    """A ``GPT2LMHeadModel`` folder's files, as :func:`hf_marian_files`."""
    s = tokenizer.specials
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], **hf_gpt2_config_kwargs(model),
              "bos_token_id": s.bos, "eos_token_id": s.eos}  # fmt: skip
    return {
        "config.json": config,
        "generation_config.json": {"bos_token_id": s.bos, "eos_token_id": s.eos, "pad_token_id": s.pad},
        "tokenizer_config.json": _tokenizer_config(tokenizer, model.config.max_len),
        "tokenizer.json": tokenizer.to_str(),
        "weights": to_hf_gpt2(model),
    }


def hf_bert_files(model: EncoderModel, tokenizer: Tokenizer, labels: list[str]) -> dict[str, str | dict]:
    """A BERT folder's files (the class of the model's head), as :func:`hf_marian_files`; ``labels``
    names a classifier's classes in order."""
    c = model.config
    config = {"model_type": "bert", "architectures": [HF_CLASS[c.head]], **hf_bert_config_kwargs(model)}
    if c.head == "classify" and len(labels) == c.num_labels:
        config["id2label"] = dict(enumerate(labels))
        config["label2id"] = {label: i for i, label in enumerate(labels)}
    names, s = tokenizer.hf.id_to_token, tokenizer.specials
    tokenizer_config = {**_tokenizer_config(tokenizer, c.max_len), "cls_token": names(s.bos),
                        "sep_token": names(s.eos)}  # fmt: skip
    return {
        "config.json": config,
        "tokenizer_config.json": tokenizer_config,
        "tokenizer.json": tokenizer.to_str(),
        "weights": to_hf_bert(model),
    }


def _tokenizer_config(tokenizer: Tokenizer, max_len: int) -> dict[str, str | int]:
    """``tokenizer_config.json``: the special tokens by role, for ``PreTrainedTokenizerFast``."""
    names, s = tokenizer.hf.id_to_token, tokenizer.specials
    roles = {
        "bos_token": s.bos,
        "eos_token": s.eos,
        "pad_token": s.pad,
        "unk_token": s.unk,
        "mask_token": s.mask,
    }
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len,
            **{role: names(i) for role, i in roles.items() if i is not None}}  # fmt: skip


def hf_class_and_inputs(model: nn.Module) -> tuple[str, str]:
    """The HF class that loads ``model``'s export, and how its inputs are made (as attnkit makes them)."""
    if isinstance(model, EncoderDecoder):
        return "MarianMTModel", "append </s> to each source's ids, as attnkit does"
    if isinstance(model, DecoderModel):
        return "GPT2LMHeadModel", "a prompt is its tokens, as in attnkit generate"
    return HF_CLASS[model.config.head], "a sentence is [CLS] + its tokens + [SEP], as in attnkit"


def export_hf(
    model: nn.Module,
    tokenizer: Tokenizer,
    out: Path,
    labels: Sequence[str] = (),
    *,
    maker: MadeBy = IN_MEMORY,
    overwrite: bool = False,
) -> Path:
    """Write the folder ``out`` atomically, ``maker`` recorded as what made it (folders.py: what it
    replaces): a Marian, GPT-2 or BERT folder for an encoder-decoder, decoder or encoder; ``labels``: a
    classifier's label names."""
    if isinstance(model, EncoderDecoder):
        files = hf_marian_files(model, tokenizer)
    elif isinstance(model, DecoderModel):
        files = hf_gpt2_files(model, tokenizer)
    elif isinstance(model, EncoderModel):
        files = hf_bert_files(model, tokenizer, list(labels))
    else:
        raise ConversionError(
            f"--to hf exports Transformers (Marian, GPT-2, BERT), not {type(model).__name__}"
        )

    def write(folder: Path) -> None:
        weights = {name: tensor.contiguous() for name, tensor in files.pop("weights").items()}
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        for name, content in files.items():
            text = content if isinstance(content, str) else json.dumps(content, indent=2)
            (folder / name).write_text(text, encoding="utf-8")

    return write_folder(out, write, maker, overwrite=overwrite)


def export_ctranslate2(
    model: EncoderDecoder | DecoderModel,
    tokenizer: Tokenizer,
    decode: dict,
    out: Path,
    quantization: str | None = None,
    *,
    maker: MadeBy = IN_MEMORY,
    overwrite: bool = False,
) -> Path:
    """Write a CTranslate2 model folder ``out`` atomically (a translation model for an encoder-decoder,
    a generator for a decoder), ``maker`` recorded as what made it (folders.py: what it replaces);
    ``quantization`` as CTranslate2 names it (``int8``, ``int8_float32``, ...; none: float32 weights)."""
    try:
        import ctranslate2  # noqa: F401  (the spec below needs it)
    except ImportError:
        raise ConversionError(
            "--to ctranslate2 needs CTranslate2: pip install 'attnkit[ctranslate2]'"
        ) from None
    spec = ctranslate2_spec(model, tokenizer)
    spec.validate()
    spec.optimize(quantization=quantization)

    def write(folder: Path) -> None:
        spec.save(native_path(folder))
        (folder / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
        (folder / DECODE_FILE).write_text(json.dumps(decode, indent=2), encoding="utf-8")
        held = {"arch": model.config.arch, "context": model.config.max_len}
        (folder / MODEL_FILE).write_text(json.dumps(held, indent=2), encoding="utf-8")

    return write_folder(out, write, maker, overwrite=overwrite)
