"""Loading a trained model (or a CTranslate2 export) for the commands that run it, with its options
checked first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from attnkit.cli.shared import note
from attnkit.config import without_precision
from attnkit.errors import AttnkitError
from attnkit.models import archs

if TYPE_CHECKING:
    from attnkit.decode.ct2 import CTranslate2Translator


T = TypeVar("T")
ENGINES = ("attnkit", "ctranslate2")


def with_options(given: dict[str, Any], load: Callable[[dict[str, Any]], T]) -> T:
    """``load(changes)`` with the decode settings the options gave (``given``: None = not given); a value
    out of range names its option (``--top-k``), not the config field (``decode.top_k``)."""
    changes = {name: value for name, value in given.items() if value is not None}
    try:
        return load(changes)
    except AttnkitError as error:
        message = str(error)
        for name in changes:
            message = message.replace(f"decode.{name}", "--" + name.replace("_", "-"))
        raise AttnkitError(message) from None


def check_engine(engine: str, precision: str | None = None, int8: bool = False) -> None:
    """A one-line error unless ``--engine`` names one of :data:`ENGINES`, or if ``--precision`` or
    ``--int8`` (attnkit's own) comes with CTranslate2, whose precision is chosen at export."""
    if engine not in ENGINES:
        raise AttnkitError(f"--engine {engine!r}: choose {' or '.join(ENGINES)}")
    if engine == "ctranslate2" and (int8 or precision is not None):
        given = "--int8" if int8 else f"--precision {precision}"
        at_export = "int8 at export: --quantization int8" if int8 or precision == "int8" else (
            "its precision at export (--quantization)")  # fmt: skip
        raise AttnkitError(f"{given} is attnkit's; CTranslate2 takes {at_export}")


def no_decoding(overrides: list[str], arch: str) -> None:
    """A one-line error if decode settings (but the precision) were given for a model scored without
    decoding."""
    from attnkit.loading import a_model

    if without_precision(overrides):
        given = " ".join(without_precision(overrides))
        raise AttnkitError(f"{given}: {a_model(arch)} is scored without decoding")


def load_translator(ckpt: Path, device: torch.device, overrides: list[str]):
    """A translation or summarisation checkpoint (Transformer or RNN) loaded for decoding on ``device``,
    its decode settings changed by ``overrides`` (``decode.field=value``, ``decode.precision`` too)."""
    from attnkit.loading import load_for_inference

    return load_for_inference(ckpt, device, arch=archs(using="translate"), overrides=overrides)


def ctranslate2_translator(folder: Path, overrides: list[str]) -> CTranslate2Translator:
    """The CTranslate2 engine of an exported folder, its decode settings changed by ``overrides``."""
    from attnkit.decode.ct2 import CTranslate2Translator

    return CTranslate2Translator(folder, overrides, warn=note)


def load_encoder(ckpt: Path, heads: tuple[str, ...], device: torch.device, overrides: list[str] = ()):
    """An encoder checkpoint whose head is one of ``heads`` (a one-line error names what it has), in the
    precision ``overrides`` may give (``decode.precision=bf16``)."""
    from attnkit.loading import check_head, load_for_inference

    encoders = archs(using="predict", reading="text")
    model, tokenizer, config = load_for_inference(ckpt, device, arch=encoders, overrides=overrides)
    check_head(ckpt, config, heads)
    return model, tokenizer, config
