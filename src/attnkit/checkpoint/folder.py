"""A checkpoint folder: written whole or not at all, found from a run directory, read back.

``step-0000500/`` holds ``config.json``, ``model.safetensors`` (or an FSDP run's shards, sharded.py),
``tokenizer.json`` and, to resume, the trainer's state (trainer_state.py). ``last`` and ``best`` in the
run directory name a folder; they are replaced only once the folder is complete.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_model

from attnkit.atomic import write_text_atomic
from attnkit.checkpoint.ctranslate2_folder import ctranslate2_command, exported_model
from attnkit.checkpoint.files import read_json, read_safetensors
from attnkit.checkpoint.sharded import SHARDED, holds_shards, read_whole, write_sharded
from attnkit.checkpoint.trainer_state import TrainerState, rng_state, write_trainer_state
from attnkit.config import RunConfig
from attnkit.errors import AttnkitError, ConfigError
from attnkit.folders import MadeBy, recover, write_folder
from attnkit.models import ARCHITECTURES, load_weights
from attnkit.processes import World

CHECKPOINT_PREFIX = "step-"


# --- writing --------------------------------------------------------------------------------------


def checkpoint_folder(run_dir: Path, step: int) -> Path:
    """Where step ``step``'s checkpoint goes: ``run_dir/step-0000500``."""
    return run_dir / f"{CHECKPOINT_PREFIX}{step:07d}"


@dataclass(frozen=True)
class CheckpointContents:
    """What a checkpoint folder holds: the weights, the run's config (as ``config.json`` has it) and its
    tokenizer (None: an image model's pixels need none); to resume, the ``optimizer``, the
    ``trainer_state`` and every process's :func:`rng_state` in rank order (``rng``, default this
    process's only); and what made it: ``command``, from ``source`` (default: the run directory)."""

    model: torch.nn.Module
    config: dict[str, Any]
    tokenizer_json: str | None
    optimizer: torch.optim.Optimizer | None = None
    trainer_state: TrainerState | None = None
    rng: list[dict[str, Any]] | None = None
    command: str = "attnkit train"
    source: str | Path | None = None


def save_checkpoint(
    run_dir: Path,
    step: int,
    contents: CheckpointContents,
    *,
    is_best: bool = False,
    keep_last: int = 5,
    shard_over: World | None = None,
) -> Path | None:
    """Write ``contents`` to ``run_dir/step-{step}`` atomically, move the pointers (``best`` too, where
    ``is_best``), and delete the checkpoints older than the ``keep_last`` newest (but those ``last`` and
    ``best`` name). A step folder already there is replaced: whoever saves into ``run_dir`` holds it
    (the trainer: :func:`lock_run`, and it refuses a directory holding another run), so a step folder
    there is this run's own. With the optimizer and the trainer's state, the checkpoint can be resumed.

    ``shard_over``: the processes of an FSDP run (``train.parallel=fsdp``), which all call this: each
    writes its shards of the model and the optimizer (sharded.py), then the first process writes the
    rest and returns the folder; the others return None.
    """
    model, optimizer = contents.model, contents.optimizer
    temporary = None
    if shard_over is not None:
        temporary = write_sharded(checkpoint_folder(run_dir, step), model, optimizer, shard_over)
        if not shard_over.is_main:
            return None

    def write(folder: Path) -> None:
        if not holds_shards(folder):
            save_model(model, str(folder / "model.safetensors"))  # handles the tied embeddings
        (folder / "config.json").write_text(json.dumps(contents.config, indent=2), encoding="utf-8")
        if contents.tokenizer_json is not None:  # image models have no tokenizer
            (folder / "tokenizer.json").write_text(contents.tokenizer_json, encoding="utf-8")
        if optimizer is not None and contents.trainer_state is not None:
            write_trainer_state(folder, optimizer, contents.trainer_state, contents.rng or [rng_state()])

    maker = MadeBy.of(contents.command, run_dir if contents.source is None else contents.source)
    final = write_folder(checkpoint_folder(run_dir, step), write, maker, overwrite=True, temporary=temporary)
    write_text_atomic(run_dir / "last", final.name)
    if is_best:
        write_text_atomic(run_dir / "best", final.name)
    _prune(run_dir, keep_last)
    return final


def holds_weights(folder: Path) -> bool:
    """Whether ``folder`` is a checkpoint: one file of weights, or the shards of an FSDP run."""
    return (folder / "model.safetensors").is_file() or holds_shards(folder)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders of a run, oldest first."""
    if not run_dir.is_dir():
        return []
    for aside in run_dir.glob(f".{CHECKPOINT_PREFIX}*.replaced"):
        recover(run_dir / aside.name[1 : -len(".replaced")])
    return sorted(p for p in run_dir.glob(f"{CHECKPOINT_PREFIX}*") if holds_weights(p))


def _prune(run_dir: Path, keep_last: int) -> None:
    keep = {
        (run_dir / name).read_text(encoding="utf-8").strip()
        for name in ("last", "best")
        if (run_dir / name).is_file()
    }
    checkpoints = list_checkpoints(run_dir)
    for old in checkpoints[: max(len(checkpoints) - keep_last, 0)]:
        if old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)


# --- reading --------------------------------------------------------------------------------------


def resolve_checkpoint(path: str | Path, prefer: str = "best") -> Path:
    """A checkpoint folder: ``path`` itself, or the one a run directory's ``best``/``last`` names."""
    path = Path(path)
    recover(path)
    if holds_weights(path):
        return path
    for pointer in (prefer, "last", "best"):
        if (path / pointer).is_file():
            target = path / (path / pointer).read_text(encoding="utf-8").strip()
            recover(target)
            if holds_weights(target):
                return target
    if (path / "last").is_file():
        raise AttnkitError(
            f"{path}: 'last' names {(path / 'last').read_text(encoding='utf-8').strip()!r}, which is gone"
        )
    if (path / "model.bin").is_file():  # what `attnkit export --to ctranslate2` writes
        arch = exported_model(path)["arch"]
        command = ARCHITECTURES[arch].commands[0]
        raise AttnkitError(
            f"{path}: a CTranslate2 model folder, not an attnkit checkpoint; {command} with it by "
            f"{ctranslate2_command(path, arch)}"
        )
    raise AttnkitError(
        f"{path}: no checkpoint here (expected model.safetensors, or a run directory with 'last')"
    )


def read_run_config(checkpoint: Path) -> RunConfig:
    """The run configuration a checkpoint was trained with."""
    values = read_json(checkpoint / "config.json")
    if not isinstance(values, dict):
        raise ConfigError(f"{checkpoint / 'config.json'}: not a run configuration")
    if "model_type" in values:  # an HF transformers folder (`attnkit export --to hf`, save_pretrained)
        raise AttnkitError(
            f"{checkpoint}: an HF transformers model folder (model_type {values['model_type']!r}), not an "
            f"attnkit checkpoint; make it one with attnkit import-hf {checkpoint} --out RUN_DIR"
        )
    return RunConfig.from_dict(values, str(checkpoint / "config.json"))


def read_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model's weights in ``checkpoint``, whole: ``model.safetensors``, or put together from the
    shards of an FSDP run."""
    if holds_shards(checkpoint):
        return read_whole(checkpoint, "model")
    return read_safetensors(checkpoint / "model.safetensors")


def load_model_weights(model: torch.nn.Module, checkpoint: Path) -> None:
    """Load the checkpoint's weights into ``model`` (re-tying shared weights)."""
    path = checkpoint / (f"{SHARDED}/model" if holds_shards(checkpoint) else "model.safetensors")
    weights = read_weights(checkpoint)
    expected = model.state_dict()
    for name, tensor in weights.items():
        if name in expected and expected[name].shape != tensor.shape:
            raise AttnkitError(
                f"{path}: '{name}' has shape {tuple(tensor.shape)} but config.json and tokenizer.json "
                f"describe {tuple(expected[name].shape)} (are the files from different checkpoints?)"
            )
    missing, unexpected = load_weights(model, weights)  # the weights already read, not the file again
    if missing or unexpected:
        raise AttnkitError(
            f"{path}: weights do not fit the config (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
