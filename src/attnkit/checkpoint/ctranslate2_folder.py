"""The other model folder attnkit writes: a CTranslate2 export (``attnkit export --to ctranslate2``),
which holds besides CTranslate2's own files what attnkit needs to run it."""

from __future__ import annotations

import json
from pathlib import Path

from attnkit.models import ARCHITECTURES, TransformerConfig

DECODE_FILE = "attnkit_decode.json"  # a CTranslate2 folder's decoding settings (the run's decode section)
MODEL_FILE = "attnkit_model.json"  # and what it holds: {"arch": the model's, "context": its positions}


def ctranslate2_command(folder: Path, arch: str) -> str:
    """The attnkit command that runs ``folder``, a CTranslate2 folder of an ``arch`` model (its main
    command, as the architecture's record says)."""
    return f"attnkit {ARCHITECTURES[arch].commands[0]} --engine ctranslate2 --ckpt {folder}"


def exported_model(folder: Path) -> dict:
    """What a CTranslate2 folder from ``attnkit export --to ctranslate2`` holds (``MODEL_FILE``): ``arch``
    and, for a decoder, ``context``. Folders exported before that file existed held translation models."""
    held = folder / MODEL_FILE
    return (
        json.loads(held.read_text(encoding="utf-8")) if held.is_file() else {"arch": TransformerConfig.ARCH}
    )
