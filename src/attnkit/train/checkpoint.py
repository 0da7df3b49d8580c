"""Checkpoints: safetensors + JSON, written atomically, self-contained, resumable.

A run directory holds one folder per checkpoint, ``step-000500/``, each with everything a later command
needs: ``config.json``, ``model.safetensors``, ``tokenizer.json``, and for resuming
``trainer_state.safetensors`` (optimizer tensors, RNG states) + ``trainer_state.json`` (step, epoch,
position in the epoch, best score, scalar optimizer settings). ``last`` and ``best`` are small text
files naming a checkpoint folder.

Why atomic: none of the usual tools (nanoGPT, JoeyNMT, HF) is, and a run killed while saving then
leaves a torn file that breaks resuming. Here a checkpoint is written into a hidden temporary folder,
every file fsync'ed, the folder renamed into place in one step, and only then are the ``last``/``best``
pointers replaced (also by rename). A kill at any moment leaves the previous checkpoint intact and the
pointers naming complete folders. Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from attnkit.config import RunConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import AttnkitError
from attnkit.models.seq2seq import build_transformer

CHECKPOINT_PREFIX = "step-"


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _make_shareable(path: Path) -> None:
    """Give a file or folder made by ``tempfile`` (private, 0600/0700) the usual permissions for the
    user's umask, so that a checkpoint can be shared like any other file."""
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_umask())


def _publish(temporary: Path, final: Path) -> None:
    """Move a fully written temporary folder to ``final`` in one rename: fsync its files, give it the
    user's usual permissions, replace an older ``final``, and fsync the parent so the rename is durable."""
    for file in temporary.iterdir():
        _fsync_file(file)
    _make_shareable(temporary)
    if final.exists():  # e.g. a re-run of the same step, or averaging again
        shutil.rmtree(final)
    os.replace(temporary, final)
    _fsync_dir(final.parent)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a reader sees the old or the new content, never a mix."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, prefix=f".{path.name}.") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    _make_shareable(Path(f.name))
    os.replace(f.name, path)
    _fsync_dir(path.parent)


def _rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = state
    version, internal, gauss = random.getstate()
    return tensors, {"python_rng": [version, list(internal), gauss]}


def _set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, internal, gauss = meta["python_rng"]
    random.setstate((version, tuple(internal), gauss))


def _optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The optimizer's state split into tensors (for safetensors) and plain values (for JSON)."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, per_param in state["state"].items():
        for key, value in per_param.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{index}.{key}"] = value.contiguous()
            else:
                scalars[f"{index}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _load_optimizer_state(optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    for name, value in meta["scalars"].items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_checkpoint(
    run_dir: Path,
    step: int,
    *,
    model: torch.nn.Module,
    config: dict[str, Any],
    tokenizer_json: str,
    optimizer: torch.optim.Optimizer | None = None,
    trainer_state: dict[str, Any] | None = None,
    is_best: bool = False,
    keep_last: int = 5,
) -> Path:
    """Write ``run_dir/step-{step}`` atomically, move the pointers, and prune old checkpoints."""
    run_dir.mkdir(parents=True, exist_ok=True)
    final = run_dir / f"{CHECKPOINT_PREFIX}{step:07d}"
    temporary = Path(tempfile.mkdtemp(dir=run_dir, prefix=f".{final.name}."))
    try:
        save_model(model, str(temporary / "model.safetensors"))  # handles the tied embeddings
        (temporary / "config.json").write_text(json.dumps(config, indent=2))
        (temporary / "tokenizer.json").write_text(tokenizer_json)
        if optimizer is not None and trainer_state is not None:
            tensors, optimizer_meta = _optimizer_state(optimizer)
            rng_tensors, rng_meta = _rng_state()
            save_file({**tensors, **rng_tensors}, str(temporary / "trainer_state.safetensors"))
            meta = {**trainer_state, "optimizer": optimizer_meta, **rng_meta}
            (temporary / "trainer_state.json").write_text(json.dumps(meta))
        _publish(temporary, final)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    write_text_atomic(run_dir / "last", final.name)
    if is_best:
        write_text_atomic(run_dir / "best", final.name)
    _prune(run_dir, keep_last)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders of a run, oldest first."""
    return sorted(p for p in run_dir.glob(f"{CHECKPOINT_PREFIX}*") if (p / "model.safetensors").is_file())


def _prune(run_dir: Path, keep_last: int) -> None:
    keep = {(run_dir / name).read_text().strip() for name in ("last", "best") if (run_dir / name).is_file()}
    checkpoints = list_checkpoints(run_dir)
    for old in checkpoints[: max(len(checkpoints) - keep_last, 0)]:
        if old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)


def resolve_checkpoint(path: str | Path, prefer: str = "best") -> Path:
    """A checkpoint folder: ``path`` itself, or the one a run directory's ``best``/``last`` names."""
    path = Path(path)
    if (path / "model.safetensors").is_file():
        return path
    for pointer in (prefer, "last", "best"):
        if (path / pointer).is_file():
            target = path / (path / pointer).read_text().strip()
            if (target / "model.safetensors").is_file():
                return target
    raise AttnkitError(
        f"{path}: no checkpoint here (expected model.safetensors, or a run directory with 'last')"
    )


def load_model_weights(model: torch.nn.Module, checkpoint: Path) -> None:
    """Load ``model.safetensors`` into ``model`` (re-tying shared weights)."""
    missing, unexpected = load_model(model, str(checkpoint / "model.safetensors"), strict=False)
    if missing or unexpected:
        raise AttnkitError(
            f"{checkpoint}: weights do not fit the config (missing {missing}, unexpected {unexpected})"
        )


def load_trainer_state(checkpoint: Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore optimizer and RNG states; return the trainer's JSON state (step, epoch, position, ...)."""
    tensors = load_file(str(checkpoint / "trainer_state.safetensors"))
    meta = json.loads((checkpoint / "trainer_state.json").read_text())
    _load_optimizer_state(optimizer, tensors, meta.pop("optimizer"))
    _set_rng_state(tensors, meta)
    meta.pop("python_rng")
    return meta


def load_for_inference(path: str | Path, device: torch.device | str = "cpu", prefer: str = "best"):
    """``(model, tokenizer, run config)`` from a checkpoint folder or run directory, in eval mode."""
    checkpoint = resolve_checkpoint(path, prefer)
    config = RunConfig.from_dict(
        json.loads((checkpoint / "config.json").read_text()), str(checkpoint / "config.json")
    )
    tokenizer = Tokenizer.load(checkpoint / "tokenizer.json")
    model = build_transformer(config.model, tokenizer.vocab_size)
    load_model_weights(model, checkpoint)
    return model.to(device).eval(), tokenizer, config


def average_checkpoints(checkpoints: list[Path], out: Path) -> Path:
    """Write the element-wise mean of the checkpoints' weights (Vaswani et al. §6.1 averaged the last
    5 or 20) as a new checkpoint folder with the first one's config and tokenizer; written atomically."""
    if not checkpoints:
        raise AttnkitError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    for path in checkpoints:
        weights = load_file(str(path / "model.safetensors"))
        if total and weights.keys() != total.keys():
            raise AttnkitError(f"{path}: its weights do not match {checkpoints[0]}'s; cannot average")
        for name, tensor in weights.items():
            total[name] = total.get(name, 0) + tensor.double()
    averaged = {name: (tensor / len(checkpoints)).float().contiguous() for name, tensor in total.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        save_file(averaged, str(temporary / "model.safetensors"))
        for name in ("config.json", "tokenizer.json"):
            shutil.copyfile(checkpoints[0] / name, temporary / name)
        _publish(temporary, out)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return out
