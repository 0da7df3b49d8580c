"""Loading a model to work with: a checkpoint folder or run directory in, ``(model, tokenizer, run
config)`` out, the model built for its tokenizer (with ``decode.speculative=shallow``, with its draft
decoder), in eval mode, with the CPU speed-ups applied in the precision ``decode.precision`` asks
for. What every command, the server and fine-tuning load a model with; the trainer builds its model
the same way (:func:`build_for_tokenizer`). The files themselves are ``attnkit.checkpoint``'s.

Precision (:func:`inference_precision`): the weights stay float32 as trained; what changes is the copy
the linear maps multiply by. ``bf16``: a bf16 copy for the processor's bf16 units, inputs rounded to bf16
on the way in, products summed and returned in float32 (``attnkit.cpu.linear``), everything else float32;
``int8``: int8 weights and inputs (``--int8``, CTranslate2's int8); ``fp32``: float32 throughout.
``auto`` is bf16 on a CPU whose bf16 products are fast (``attnkit.cpu.precision``), float32 elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from attnkit.checkpoint.draft_file import attach_draft
from attnkit.checkpoint.folder import load_model_weights, read_run_config, resolve_checkpoint
from attnkit.config import RunConfig, draft_checkpoint, with_decode_overrides
from attnkit.cpu import pack_for_inference, quantize_int8, speed_up
from attnkit.cpu.linear import linear_precision
from attnkit.cpu.precision import matrix_units
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import AttnkitError
from attnkit.models import ARCHITECTURES, build_model
from attnkit.models.caption_transformer import CaptionTransformer
from attnkit.models.decoder_only import DecoderModel
from attnkit.models.seq2seq import EncoderDecoder


def build_for_tokenizer(config: RunConfig, tokenizer: Tokenizer | None) -> torch.nn.Module:
    """The model of ``config`` for ``tokenizer``: its vocabulary size, and its ``<pad>`` as the model's
    padding id (``config.model.pad_id`` is set from the tokenizer, the one source of truth); an image
    model has no tokenizer (``None``)."""
    if tokenizer is None:
        return build_model(config.model, None)
    config.model.pad_id = tokenizer.specials.pad
    return build_model(config.model, tokenizer.vocab_size)


def read_tokenizer(checkpoint: Path, config: RunConfig) -> Tokenizer | None:
    """The checkpoint's tokenizer; ``None`` for an image model that writes no text, which has none."""
    has_vocabulary = ARCHITECTURES[config.model.arch].has_vocabulary
    return Tokenizer.load(checkpoint / "tokenizer.json") if has_vocabulary else None


def commands_for(arch: str) -> str:
    """The commands that use a trained ``arch`` model: ``"attnkit translate / evaluate"``."""
    return "attnkit " + " / ".join(ARCHITECTURES[arch].commands)


def a_model(arch: str) -> str:
    """``"an encoder-decoder model"``, ``"a decoder model"``, ``"an rnn model"``: an architecture's name
    in a sentence."""
    return f"{'an' if arch[0] in 'aeiour' else 'a'} {arch} model"  # 'r': "an rnn", read ar-en-en


def inference_precision(precision: str, device: torch.device) -> tuple[str, str]:
    """``decode.precision`` resolved for ``device`` (``fp32``, ``bf16`` or ``int8``; see the module
    docstring), and why, in words; a one-line error for bf16 or int8 off a CPU."""
    if precision != "auto":
        if precision != "fp32" and device.type != "cpu":
            raise AttnkitError(f"decode.precision={precision} is for CPUs; this would run on {device.type}")
        return precision, f"decode.precision={precision}"
    if device.type != "cpu":
        return "fp32", f"decode.precision=auto on a {device.type.upper()}"
    units = matrix_units()
    return ("bf16" if units.bf16 else "fp32"), f"decode.precision=auto: {units.why}"


def load_for_inference(
    path: str | Path,
    device: torch.device | str = "cpu",
    prefer: str = "best",
    arch: str | tuple[str, ...] | None = None,
    pack: bool = True,
    *,
    overrides: Sequence[str] = (),
):
    """``(model, tokenizer, run config)`` from a checkpoint folder or run directory, in eval mode, with
    the CPU fast path applied on a CPU (``attnkit.cpu.speed_up``): what every command and the server
    load a model to work with. With ``arch``, a checkpoint of another architecture is an error that says
    which command fits it. ``overrides`` (``decode.field=value``) change the run's decoding settings,
    checked before the model is built; ``decode.precision`` picks what the linear maps multiply in (see
    the module docstring), and the config returned holds the precision it resolved to. ``pack=False``:
    float32 weights as they are, without the copies that make inference faster (for a model loaded to
    train further or to convert), and without a draft decoder."""
    device = torch.device(device)
    checkpoint = resolve_checkpoint(path, prefer)
    config = read_run_config(checkpoint)
    if arch is not None and config.model.arch not in ((arch,) if isinstance(arch, str) else arch):
        raise AttnkitError(
            f"{checkpoint} holds {a_model(config.model.arch)}, which this command cannot use; "
            f"use {commands_for(config.model.arch)}"
        )
    config.decode = with_decode_overrides(config.decode, list(overrides))
    config.decode.precision = inference_precision(config.decode.precision, device)[0] if pack else "fp32"
    tokenizer = read_tokenizer(checkpoint, config)
    if tokenizer is not None and config.model.pad_id != tokenizer.specials.pad:
        raise AttnkitError(
            f"{checkpoint}: config.json has model.pad_id={config.model.pad_id} but tokenizer.json's <pad> "
            f"is {tokenizer.specials.pad} (are the files from different checkpoints?)"
        )
    model = build_for_tokenizer(config, tokenizer)
    load_model_weights(model, checkpoint)
    speculative = config.decode.speculative
    if (speculative == "shallow" or draft_checkpoint(speculative)) and pack:  # its draft, made ready with it
        # (a draft decoder for the encoder-decoder Transformer and GPT; a draft model, for a Transformer
        # captioner too)
        drafted = (EncoderDecoder, DecoderModel) + (() if speculative == "shallow" else (CaptionTransformer,))
        if not isinstance(model, drafted):
            what = "draft decoders" if speculative == "shallow" else "draft models"
            kinds = "" if speculative == "shallow" else ", and the Transformer captioner"
            raise AttnkitError(
                f"decode.speculative={speculative}: {what} are for the encoder-decoder Transformer and "
                f"GPT{kinds}; {checkpoint} holds {a_model(config.model.arch)}"
            )
        if speculative == "shallow":
            attach_draft(model, checkpoint)
        else:
            model.draft = draft_model(speculative, config, tokenizer, device)
    return ready_for_inference(model, config, device, pack), tokenizer, config


def draft_model(
    path: str, config: RunConfig, tokenizer: Tokenizer | None, device: torch.device
) -> torch.nn.Module:
    """The model of another checkpoint (``decode.speculative=PATH``) as the draft of ``config``'s: of the
    same architecture and vocabulary (its ids mean the same tokens), with a context at least as long
    (it reads every position the model does); a one-line error naming what differs otherwise. Its
    float32 weights as trained: it is made ready with the model it drafts for."""
    what = f"decode.speculative={path}"
    try:
        checkpoint = resolve_checkpoint(path)
    except AttnkitError as error:  # a misspelt kind of drafts reads as a path
        raise AttnkitError(f"{what}: {error} (decode.speculative is none, source, shallow or a draft "
                           "checkpoint's folder or run directory)") from None  # fmt: skip
    arch = read_run_config(checkpoint).model.arch
    if arch != config.model.arch:
        raise AttnkitError(
            f"{what} holds {a_model(arch)}; the draft of {a_model(config.model.arch)} is one too"
        )
    draft, draft_tokenizer, draft_config = load_for_inference(
        checkpoint, device, pack=False, overrides=["decode.speculative=none"]
    )
    if tokenizer is None or draft_tokenizer is None or _vocabulary(draft_tokenizer) != _vocabulary(tokenizer):
        raise AttnkitError(
            f"{what}: its vocabulary is not the model's (a draft's ids must mean the same tokens)"
        )
    if draft_config.model.max_len < config.model.max_len:
        raise AttnkitError(
            f"{what}: its context holds {draft_config.model.max_len} positions, the model's "
            f"{config.model.max_len} (a draft reads every position the model does)"
        )
    return draft


def _vocabulary(tokenizer: Tokenizer) -> dict[str, int]:
    return tokenizer.hf.get_vocab()


def ready_for_inference(
    model: torch.nn.Module, config: RunConfig, device: torch.device | str = "cpu", pack: bool = True
) -> torch.nn.Module:
    """``model``, its weights loaded, on ``device`` in eval mode with the CPU fast path applied in
    ``config.decode.precision`` (resolved: fp32, bf16 or int8; see the module docstring); the config
    then holds the precision it runs in. ``pack=False``: the weights as they are."""
    model = model.to(device).eval()
    precision = config.decode.precision
    speed_up(model, inference=pack and precision == "fp32")
    if precision == "bf16":
        if not pack_for_inference(model, torch.bfloat16):
            pack_for_inference(model)  # this torch's oneDNN packs no bf16 weights: float32's, packed
        if linear_precision(model) != "bf16":  # that, or every map too small for bf16 (a toy model's):
            config.decode.precision = "fp32"  # the config says what the maps multiply in
    elif precision == "int8":
        quantize_int8(model)
    return model


def check_head(checkpoint: Path, config: RunConfig, heads: tuple[str, ...]) -> None:
    """A one-line error unless the encoder in ``checkpoint`` has one of ``heads`` (naming what it has)."""
    if config.model.head not in heads:
        what = {
            "mlm": "a masked-LM model (attnkit predict fills its masks; to fine-tune: train.init_from)",
            "none": "an encoder without a head",
        }.get(config.model.head, config.model.head)
        raise AttnkitError(f"{checkpoint} holds {what}; this needs a {' or '.join(heads)} head")
