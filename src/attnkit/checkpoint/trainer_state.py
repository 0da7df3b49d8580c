"""What resuming needs besides the weights: ``trainer_state.safetensors`` (the optimizer's tensors,
every process's RNG tensors) and ``trainer_state.json`` (the :class:`TrainerState`: step, epoch,
position in the epoch, best score, the schedule; the optimizer's plain settings, every process's
Python RNG state).

Every process's RNG states are saved, in rank order, so that each process of a resumed multi-process run
draws what it would have drawn had the run not stopped (dropout, data order).
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from attnkit.checkpoint.files import read_json, read_safetensors
from attnkit.checkpoint.optimizer import load_state, parameter_of, split_state
from attnkit.checkpoint.sharded import holds_shards, read_whole
from attnkit.errors import AttnkitError


@dataclass
class TrainerState:
    """Where a run is: moved by the training loop, saved whole in every checkpoint, restored whole by a
    resumed run. ``position``: the batches of the epoch taken so far; ``elapsed``: seconds of training
    (validation and saving included); ``best``: the best validation score so far, higher is better (a
    loss negated), and ``bad_evals`` the validations since it; ``history``: every validation's row of
    metrics.csv; ``scheduler``: the learning-rate schedule's ``state_dict``, as the last save took it."""

    step: int = 0
    epoch: int = 0
    position: int = 0
    elapsed: float = 0.0
    best: float | None = None
    bad_evals: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    scheduler: dict[str, Any] = field(default_factory=dict)


def rng_state() -> dict[str, Any]:
    """This process's random number generator states (torch CPU, its CUDA device, Python's ``random``)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def write_trainer_state(
    folder: Path, optimizer: torch.optim.Optimizer, trainer_state: TrainerState, rng: list[dict[str, Any]]
) -> None:
    """``trainer_state.safetensors`` and ``.json`` in ``folder``; in a sharded checkpoint the optimizer's
    tensors are in its shards already."""
    tensors, optimizer_meta = split_state(optimizer)
    if holds_shards(folder):
        tensors = {}
    for rank, state in enumerate(rng):
        tensors[f"rng.{rank}.torch"] = state["torch"]
        if "cuda" in state:
            tensors[f"rng.{rank}.cuda"] = state["cuda"]
    save_file(tensors, str(folder / "trainer_state.safetensors"))
    python_rng = [[s["python"][0], list(s["python"][1]), s["python"][2]] for s in rng]
    meta = {**dataclasses.asdict(trainer_state), "optimizer": optimizer_meta, "world_size": len(rng),
            "python_rng": python_rng}  # fmt: skip
    (folder / "trainer_state.json").write_text(json.dumps(meta), encoding="utf-8")


def load_trainer_state(
    checkpoint: Path, optimizer: torch.optim.Optimizer, rank: int = 0
) -> tuple[TrainerState, int]:
    """Restore the optimizer and this rank's RNG states; return the trainer's state and the number of
    processes that saved it."""
    meta = read_json(checkpoint / "trainer_state.json")
    tensors = read_safetensors(checkpoint / "trainer_state.safetensors")
    if holds_shards(checkpoint):  # a sharded optimizer reads only its own slices
        tensors.update(read_whole(checkpoint, "optimizer", parameter_of(optimizer)))
    try:
        load_state(optimizer, tensors, meta.pop("optimizer"))
        python_rng = meta.pop("python_rng")
        if rank < meta["world_size"]:
            state = {"torch": tensors[f"rng.{rank}.torch"], "python": python_rng[rank]}
            if f"rng.{rank}.cuda" in tensors:
                state["cuda"] = tensors[f"rng.{rank}.cuda"]
            _set_rng_state(state)
        saved = TrainerState(**{name: meta[name] for name in TrainerState.__dataclass_fields__})
    except (KeyError, ValueError, TypeError, IndexError) as error:
        raise AttnkitError(
            f"{checkpoint}: trainer state does not fit this model and optimizer ({error})"
        ) from None
    return saved, meta["world_size"]
