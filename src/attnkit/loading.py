"""Loading a model to work with: a checkpoint folder or run directory in, ``(model, tokenizer, run
config)`` out, the model built for its tokenizer, in eval mode, with the CPU speed-ups applied. What
every command, the server and fine-tuning load a model with; the trainer builds its model the same way
(:func:`build_for_tokenizer`). The files themselves are ``attnkit.checkpoint``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from attnkit.checkpoint.folder import load_model_weights, read_run_config, resolve_checkpoint
from attnkit.config import RunConfig, with_decode_overrides
from attnkit.cpu import quantize_int8, speed_up
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import AttnkitError
from attnkit.models import ARCHITECTURES, build_model


def build_for_tokenizer(config: RunConfig, tokenizer: Tokenizer | None) -> torch.nn.Module:
    """The model of ``config`` for ``tokenizer``: its vocabulary size, and its ``<pad>`` as the model's
    padding id (``config.model.pad_id`` is set from the tokenizer, the one source of truth); an image
    model has no tokenizer (``None``)."""
    if tokenizer is None:
        return build_model(config.model, None)
    config.model.pad_id = tokenizer.specials.pad
    return build_model(config.model, tokenizer.vocab_size)


def read_tokenizer(checkpoint: Path, config: RunConfig) -> Tokenizer | None:
    """The checkpoint's tokenizer; ``None`` for an image model, which has none."""
    reads_images = ARCHITECTURES[config.model.arch].reads == "images"
    return None if reads_images else Tokenizer.load(checkpoint / "tokenizer.json")


def commands_for(arch: str) -> str:
    """The commands that use a trained ``arch`` model: ``"attnkit translate / evaluate"``."""
    return "attnkit " + " / ".join(ARCHITECTURES[arch].commands)


def a_model(arch: str) -> str:
    """``"an encoder-decoder model"``, ``"a decoder model"``, ``"an rnn model"``: an architecture's name
    in a sentence."""
    return f"{'an' if arch[0] in 'aeiour' else 'a'} {arch} model"  # 'r': "an rnn", read ar-en-en


def load_for_inference(
    path: str | Path,
    device: torch.device | str = "cpu",
    prefer: str = "best",
    arch: str | tuple[str, ...] | None = None,
    pack: bool = True,
    *,
    int8: bool = False,
    overrides: Sequence[str] = (),
):
    """``(model, tokenizer, run config)`` from a checkpoint folder or run directory, in eval mode, with
    the CPU fast path applied on a CPU (``attnkit.cpu.speed_up``): what every command and the server
    load a model to work with. With ``arch``, a checkpoint of another architecture is an error that says
    which command fits it. ``pack``: on a CPU, also keep the linear layers' weights in oneDNN's layout
    for faster inference (one more copy of them in memory); ``int8``: instead, the linear maps multiply
    int8 weights and inputs (``--int8``, CPU only). ``overrides`` (``decode.field=value``) change the
    run's decoding settings, checked before the model is built."""
    device = torch.device(device)
    if int8 and device.type != "cpu":
        raise AttnkitError(f"--int8 is for CPUs; this would decode on {device.type}")
    checkpoint = resolve_checkpoint(path, prefer)
    config = read_run_config(checkpoint)
    if arch is not None and config.model.arch not in ((arch,) if isinstance(arch, str) else arch):
        raise AttnkitError(
            f"{checkpoint} holds {a_model(config.model.arch)}, which this command cannot use; "
            f"use {commands_for(config.model.arch)}"
        )
    config.decode = with_decode_overrides(config.decode, list(overrides))
    tokenizer = read_tokenizer(checkpoint, config)
    if tokenizer is not None and config.model.pad_id != tokenizer.specials.pad:
        raise AttnkitError(
            f"{checkpoint}: config.json has model.pad_id={config.model.pad_id} but tokenizer.json's <pad> "
            f"is {tokenizer.specials.pad} (are the files from different checkpoints?)"
        )
    model = build_for_tokenizer(config, tokenizer)
    load_model_weights(model, checkpoint)
    model = model.to(device).eval()
    speed_up(model, inference=pack and not int8)
    if int8:
        quantize_int8(model)
    return model, tokenizer, config


def check_head(checkpoint: Path, config: RunConfig, heads: tuple[str, ...]) -> None:
    """A one-line error unless the encoder in ``checkpoint`` has one of ``heads`` (naming what it has)."""
    if config.model.head not in heads:
        what = {
            "mlm": "a masked-LM model (attnkit predict fills its masks; to fine-tune: train.init_from)",
            "none": "an encoder without a head",
        }.get(config.model.head, config.model.head)
        raise AttnkitError(f"{checkpoint} holds {what}; this needs a {' or '.join(heads)} head")
