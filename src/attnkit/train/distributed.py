"""Several processes through ``torchrun``: DistributedDataParallel with rank-aware batches.

``torchrun --nproc_per_node=N -m attnkit train ...`` starts N copies; each reads RANK / WORLD_SIZE /
LOCAL_RANK from the environment. Every optimizer step consumes ``update_freq × world_size`` batches and
rank r takes every world_size-th of them, so N processes with ``update_freq=1`` see the same global batch
as one process with ``update_freq=N``. The loss is divided by the *global* number of target tokens, so
the averaged gradient is the same too. NCCL on GPUs, gloo on CPUs (used by the tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from attnkit.errors import AttnkitError


def resolve_device(name: str = "auto") -> torch.device:
    """``"auto"``: the GPU when there is one, else the CPU; any other name as given (``"cuda:1"``)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise AttnkitError(f"train.device={name!r}, but this torch sees no CUDA device (use 'auto' or 'cpu')")
    return device


@dataclass
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_sum(self, values: list[float], device: torch.device) -> list[float]:
        """Sum numbers over all processes (identity for one process)."""
        if self.size == 1:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def barrier(self) -> None:
        """Wait until every process arrives here (nothing for one process)."""
        if self.size > 1:
            dist.barrier()

    def all_gather(self, value: object) -> list[object]:
        """Every process's ``value``, in rank order (``[value]`` for one process)."""
        if self.size == 1:
            return [value]
        gathered: list[object] = [None] * self.size
        dist.all_gather_object(gathered, value)  # pickles between our own processes, never from files
        return gathered


def init_world(device_kind: str) -> World:
    """Join the process group when launched by torchrun; a single process otherwise."""
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        return World()
    backend = "nccl" if device_kind == "cuda" else "gloo"
    if not dist.is_initialized():
        # Importing torch's compiler (DistributedDataParallel does) keeps references to a process group
        # that exists by then, so close_world could not end it: it would be torn down at interpreter
        # exit, where gloo's threads can abort the process (SIGABRT after a finished run). So load it
        # first, by its public reset (which has nothing to clear yet).
        torch.compiler.reset()

        dist.init_process_group(backend)
    world = World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    if device_kind == "cuda":
        torch.cuda.set_device(world.local_rank)
    return world


def shard(group: list[list[int]], world: World) -> list[list[int]]:
    """This rank's share of one optimizer step's batches."""
    return group[world.rank :: world.size]


def close_world(world: World) -> None:
    """End the process group now, with its threads, while the interpreter is whole (nothing else may
    hold it then: drop the DistributedDataParallel wrapper first)."""
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
