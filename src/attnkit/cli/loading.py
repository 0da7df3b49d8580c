"""Loading a trained model (or a CTranslate2 export) for the commands that run it, with its options
checked first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from attnkit.cli.app import note
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


def check_engine(engine: str, int8: bool) -> None:
    """A one-line error unless ``--engine`` names one of :data:`ENGINES`, or if ``--int8`` (attnkit's own
    quantisation) comes with CTranslate2, whose int8 is chosen at export."""
    if engine not in ENGINES:
        raise AttnkitError(f"--engine {engine!r}: choose {' or '.join(ENGINES)}")
    if int8 and engine == "ctranslate2":
        raise AttnkitError("--int8 is attnkit's; CTranslate2 takes int8 at export: --quantization int8")


def no_decoding(overrides: list[str], int8: bool, arch: str) -> None:
    """A one-line error if decode settings or --int8 were given for a model scored without decoding."""
    from attnkit.loading import a_model

    if overrides or int8:
        given = " ".join(overrides + (["--int8"] if int8 else []))
        raise AttnkitError(f"{given}: {a_model(arch)} is scored without decoding")


def load_translator(ckpt: Path, device: torch.device, overrides: list[str], int8: bool = False):
    """A translation or summarisation checkpoint (Transformer or RNN) loaded for decoding on ``device``,
    its decode settings changed by ``overrides`` (``decode.field=value``); ``int8``: see
    ``checkpoint.load_for_inference``."""
    from attnkit.loading import load_for_inference

    return load_for_inference(ckpt, device, arch=archs(using="translate"), int8=int8, overrides=overrides)


def ctranslate2_translator(folder: Path, overrides: list[str]) -> CTranslate2Translator:
    """The CTranslate2 engine of an exported folder, its decode settings changed by ``overrides``."""
    from attnkit.decode.ct2 import CTranslate2Translator

    return CTranslate2Translator(folder, overrides, warn=note)


def load_encoder(ckpt: Path, heads: tuple[str, ...], device: torch.device):
    """An encoder checkpoint whose head is one of ``heads`` (a one-line error names what it has)."""
    from attnkit.loading import check_head, load_for_inference

    model, tokenizer, config = load_for_inference(ckpt, device, arch=archs(using="predict"))
    check_head(ckpt, config, heads)
    return model, tokenizer, config
