"""Complete models, each readable top to bottom, and the one table of architectures.

An architecture is a config dataclass plus a model class, named by the config's ``arch`` field (in a
run's YAML and in a checkpoint's ``config.json``); :func:`build_model` builds any of them. Its record
(:class:`Architecture`) also says what it reads, which commands use it and what it exports to: every
other place (the command line, the checkpoint loader's advice, export) reads it from here. Which tasks
train it is the tasks' records' to say (``attnkit/task_records.py``): a model knows no task.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.errors import ConfigError, require_one_of
from attnkit.models.caption_transformer import CaptionTransformer, CaptionTransformerConfig
from attnkit.models.captioner import Captioner, CaptionerConfig
from attnkit.models.config import DecoderModelConfig, EncoderModelConfig, TransformerConfig
from attnkit.models.decoder_only import DecoderModel
from attnkit.models.encoder_only import EncoderModel
from attnkit.models.glimpse import GlimpseClassifier, GlimpseConfig, WholeImageClassifier, WholeImageConfig
from attnkit.models.listen_attend_spell import ListenAttendSpell, ListenAttendSpellConfig
from attnkit.models.rnn import RNNConfig, RNNSeq2Seq
from attnkit.models.seq2seq import EncoderDecoder, Generator, build_transformer


@dataclass(frozen=True)
class Architecture:
    """What an architecture is and what it can do."""

    config: type  # its config dataclass (``config.ARCH`` is its name)
    model: type  # its model class, built from (config, vocabulary size)
    kind: str  # what it is, in a sentence: "a translation model"
    reads: str  # "text" (through a tokenizer), "images" (pixels) or "audio" (log-mel frames)
    commands: tuple[str, ...]  # the attnkit commands that use a trained one, its main use first
    exports: tuple[str, ...] = ()  # what attnkit export --to writes it as
    # "text" where it writes text from images (a captioner: a tokenizer.json for its words); an image
    # model that does not has no vocabulary and no tokenizer.json
    writes: str = ""

    @property
    def name(self) -> str:
        return self.config.ARCH

    @property
    def has_vocabulary(self) -> bool:
        """Whether it reads or writes text: built for a vocabulary's size, a tokenizer.json beside it."""
        return self.reads == "text" or self.writes == "text"


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture(
            config=TransformerConfig,
            model=EncoderDecoder,
            kind="a translation model",
            reads="text",
            commands=("translate", "evaluate"),
            exports=("hf", "ctranslate2"),
        ),
        Architecture(
            config=DecoderModelConfig,
            model=DecoderModel,
            kind="a decoder (GPT-style) model",
            reads="text",
            commands=("generate", "evaluate"),
            exports=("hf", "ctranslate2"),
        ),
        Architecture(
            config=EncoderModelConfig,
            model=EncoderModel,
            kind="an encoder (BERT-style) model",
            reads="text",
            commands=("predict", "evaluate --data"),
            exports=("hf",),
        ),
        Architecture(
            config=RNNConfig,
            model=RNNSeq2Seq,
            kind="an RNN translation model",
            reads="text",
            commands=("translate", "evaluate"),
        ),
        Architecture(
            config=GlimpseConfig,
            model=GlimpseClassifier,
            kind="a glimpse classifier",
            reads="images",
            commands=("evaluate",),
        ),
        Architecture(
            config=CaptionerConfig,
            model=Captioner,
            kind="an image captioner",
            reads="images",
            writes="text",
            commands=("evaluate", "predict"),
        ),
        Architecture(
            config=CaptionTransformerConfig,
            model=CaptionTransformer,
            kind="a Transformer image captioner",
            reads="images",
            writes="text",
            commands=("evaluate", "predict"),
        ),
        Architecture(
            config=ListenAttendSpellConfig,
            model=ListenAttendSpell,
            kind="a speech recogniser",
            reads="audio",
            writes="text",
            commands=("evaluate", "predict"),
        ),
        Architecture(
            config=WholeImageConfig,
            model=WholeImageClassifier,
            kind="a whole-image classifier",
            reads="images",
            commands=("evaluate",),
        ),
    )
}


def archs(
    *,
    using: str | None = None,
    exporting: str | None = None,
    reading: str | None = None,
    writing: str | None = None,
) -> tuple:
    """The names of the architectures that a command uses (``using="translate"``), that export to a
    format (``exporting="hf"``), that read ``"text"`` or ``"images"`` or that write ``"text"`` (from
    what they read): each as its record says."""
    return tuple(
        a.name
        for a in ARCHITECTURES.values()
        if (using is None or using in a.commands)
        and (exporting is None or exporting in a.exports)
        and (reading is None or a.reads == reading)
        and (writing is None or a.writes == writing)
    )


PRESETS: dict[str, type] = {name: a.config for a in ARCHITECTURES.values() for name in a.config.PRESETS}


def config_class(arch: str) -> type:
    """The config dataclass of architecture ``arch``."""
    require_one_of("model.arch", arch, tuple(ARCHITECTURES))
    return ARCHITECTURES[arch].config


def from_preset(name: str, **overrides: Any):
    """The config of a preset of any architecture (``"paper-base"``, ``"gpt2"``, ...)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name].from_preset(name, **overrides)


def build_model(config: Any, vocab_size: int | None) -> nn.Module:
    """The one way to build a model of any architecture from its config and vocabulary size (``None``
    for the image models, which read pixels)."""
    if isinstance(config, TransformerConfig):
        return build_transformer(config, vocab_size)
    return ARCHITECTURES[config.arch].model(config, vocab_size)


def load_weights(model: nn.Module, weights: Mapping[str, Tensor]) -> tuple[list[str], list[str]]:
    """Load ``weights`` (attnkit's parameter names) into ``model``; return the names that were missing
    and those that were extra. A tied parameter, which shares its tensor with one that was given (the
    paper's shared embeddings, an output tied to its embedding), is not missing: safetensors'
    ``save_model`` and the HF layouts store a tied tensor under one name only."""
    expected = model.state_dict()
    given = {expected[name].data_ptr() for name in weights if name in expected}
    result = model.load_state_dict(dict(weights), strict=False)
    missing = [name for name in result.missing_keys if expected[name].data_ptr() not in given]
    return missing, list(result.unexpected_keys)


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode (no dropout) inside the block, back in its former mode after it. A model
    already in eval mode is left as it is: ``eval()`` sets every module's flag through
    ``Module.__setattr__`` (0.5 ms for a small Transformer's 123 modules, twice per block), where looking
    at the flags takes a sixth of that; a search of one sentence took two such blocks."""
    was_training = model.training
    if was_training or any(module.training for module in model.modules()):
        model.eval()
    try:
        yield model
    finally:
        if was_training:
            model.train()


def device_of(model: nn.Module) -> torch.device:
    """Where ``model``'s parameters are: where the inputs of its inference go (translate, generate)."""
    return next(model.parameters()).device


def unwrap(model: nn.Module) -> nn.Module:
    """The model itself, also when DDP wraps it (for what the model offers beyond ``forward``)."""
    return getattr(model, "module", model)


__all__ = [
    "ARCHITECTURES",
    "PRESETS",
    "Architecture",
    "DecoderModel",
    "DecoderModelConfig",
    "EncoderDecoder",
    "EncoderModel",
    "EncoderModelConfig",
    "Generator",
    "RNNConfig",
    "RNNSeq2Seq",
    "TransformerConfig",
    "archs",
    "build_model",
    "build_transformer",
    "config_class",
    "evaluating",
    "from_preset",
    "load_weights",
    "unwrap",
]
