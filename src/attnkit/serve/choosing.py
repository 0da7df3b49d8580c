"""Which served class serves a checkpoint or an exported folder, and how it is loaded: the one table of
them (:data:`ATTNKIT_MODELS`, each class naming its architectures), read by ``attnkit serve`` before
the server starts, so that a checkpoint the server cannot serve, or settings it cannot take, are a
one-line error then rather than a failed load after it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from attnkit.config import draft_checkpoint, with_decode_overrides, without_precision
from attnkit.errors import AttnkitError
from attnkit.serve.captioner import ServedCaptioner
from attnkit.serve.decoder import ServedDecoder
from attnkit.serve.predictor import ServedPredictor
from attnkit.serve.recogniser import ServedRecogniser
from attnkit.serve.served import CHECKPOINT_DRAFTS, AttnkitModel, ServedModel
from attnkit.serve.translator import ServedTranslator

# the models attnkit itself serves, the first that serves an architecture taking it
ATTNKIT_MODELS: tuple[type[AttnkitModel], ...] = (
    ServedTranslator,
    ServedDecoder,
    ServedPredictor,
    ServedCaptioner,
    ServedRecogniser,
)


def attnkit_model(
    ckpt: Path, overrides: list[str], warn: Callable[[str], None] | None = None
) -> tuple[type[ServedModel], Callable[[], ServedModel]]:
    """The served class of a checkpoint (or run directory: its best), which names its endpoints, and how
    to load it (after the server starts); a wrong path, a bad decode setting, one given to a model that
    does not decode, or an architecture nobody serves is a one-line error now. ``warn`` hears that the
    server checks none of the drafts ``decode.speculative`` asks for (its :attr:`~AttnkitModel.drafts`):
    it decodes without them."""
    from attnkit.checkpoint.folder import read_run_config, resolve_checkpoint
    from attnkit.loading import commands_for

    checkpoint = resolve_checkpoint(ckpt)
    config = read_run_config(checkpoint)
    arch = config.model.arch
    served = next((served for served in ATTNKIT_MODELS if arch in served.architectures()), None)
    if served is None:
        raise AttnkitError(
            f"{checkpoint}: attnkit serve does not serve {arch} models yet; use {commands_for(arch)}"
        )
    if not served.decodes and without_precision(overrides):
        raise AttnkitError(
            f"{' '.join(without_precision(overrides))}: decode settings are for translation and decoder "
            "models, not encoders (--precision is for every model)"
        )
    speculative = with_decode_overrides(config.decode, overrides).speculative  # decode.beam_size=0, say
    kind = CHECKPOINT_DRAFTS if draft_checkpoint(speculative) else speculative
    if served.decodes and kind not in ("none", *served.drafts):
        if warn is not None:
            warn(
                f"decode.speculative={speculative}: the server checks no such drafts yet (a translator's "
                "and a decoder's greedy requests check drafts: decode.speculative=source, shallow or a draft "
                "checkpoint); it decodes without them"
            )
        overrides = [*overrides, "decode.speculative=none"]
    return served, partial(served.load, checkpoint, overrides)


def engine_model(
    folder: Path, overrides: list[str], warn: Callable[[str], None] | None = None
) -> tuple[type[ServedModel], Callable[[], ServedModel]]:
    """The served class of a folder that ``attnkit export --to ctranslate2`` wrote, and how to load it
    (``warn`` hears of a decoding setting CTranslate2 cannot follow); a folder that is not one, a bad
    decode setting, or a machine without CTranslate2 is a one-line error now."""
    from attnkit.checkpoint.ctranslate2_folder import exported_model
    from attnkit.decode.ct2 import check_exported_folder, exported_decode
    from attnkit.models import DecoderModelConfig
    from attnkit.serve.ctranslate2 import EngineDecoder, EngineTranslator

    check_exported_folder(folder)
    exported_decode(folder, overrides)
    decoder = exported_model(folder)["arch"] == DecoderModelConfig.ARCH
    served: type[EngineDecoder | EngineTranslator] = EngineDecoder if decoder else EngineTranslator
    return served, partial(served.load, folder, overrides, warn)
