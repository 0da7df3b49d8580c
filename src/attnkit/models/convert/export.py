"""``attnkit export``: a translation checkpoint as a folder another tool loads as it is.

``--to hf``: ``MarianMTModel.from_pretrained(OUT)`` reads the folder: ``config.json`` (a ``MarianConfig``),
``model.safetensors`` (``to_hf_marian``'s state dict), ``generation_config.json`` (attnkit's decoding: start
from ``<s>``, never produce ``<pad>`` or ``<s>``, stop at ``</s>``) and the tokenizer (``tokenizer.json`` and
a ``tokenizer_config.json`` naming its special tokens, for ``PreTrainedTokenizerFast``). A model with the
paper's interleaved sinusoids is first turned into the equivalent one with Marian's concatenated layout
(``with_concatenated_sinusoids``). Sources are encoded as attnkit does, tokens followed by ``</s>``: the
tokenizer adds nothing, so append ``eos_token_id`` to each source.

``--to ctranslate2``: a CTranslate2 model folder (``models/convert/ctranslate2.py``; the optional extra
``ctranslate2``) plus attnkit's ``tokenizer.json`` and the run's decoding settings
(``attnkit_decode.json``), for ``attnkit translate --engine ctranslate2``.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import ConversionError
from attnkit.models.convert.ctranslate2 import ctranslate2_spec
from attnkit.models.convert.marian import hf_marian_config_kwargs, to_hf_marian, with_concatenated_sinusoids
from attnkit.models.seq2seq import EncoderDecoder
from attnkit.train.checkpoint import write_folder

DECODE_FILE = "attnkit_decode.json"  # a CTranslate2 folder's decoding settings (the run's decode section)


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
    names = tokenizer.hf.id_to_token
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": names(s.bos),
        "eos_token": names(s.eos),
        "pad_token": names(s.pad),
        "unk_token": names(s.unk),
        "model_max_length": model.config.max_len,
    }
    return {
        "config.json": config,
        "generation_config.json": generation,
        "tokenizer_config.json": tokenizer_config,
        "tokenizer.json": tokenizer.to_str(),
        "weights": to_hf_marian(model),
    }


def export_hf(model: EncoderDecoder, tokenizer: Tokenizer, out: Path) -> Path:
    """Write the folder ``out`` atomically (an existing folder is replaced whole)."""
    files = hf_marian_files(model, tokenizer)

    def write(folder: Path) -> None:
        weights = {name: tensor.contiguous() for name, tensor in files.pop("weights").items()}
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        for name, content in files.items():
            text = content if isinstance(content, str) else json.dumps(content, indent=2)
            (folder / name).write_text(text, encoding="utf-8")

    return write_folder(out, write)


def export_ctranslate2(
    model: EncoderDecoder, tokenizer: Tokenizer, decode: dict, out: Path, quantization: str | None = None
) -> Path:
    """Write a CTranslate2 model folder ``out`` atomically; ``quantization`` as CTranslate2 names it
    (``int8``, ``int8_float32``, ...; none: float32 weights)."""
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
        spec.save(str(folder))
        (folder / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
        (folder / DECODE_FILE).write_text(json.dumps(decode, indent=2), encoding="utf-8")

    return write_folder(out, write)
