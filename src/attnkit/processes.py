"""Several processes of one command, started by ``torchrun``: the process group they share (:class:`World`),
for training and inference alike, and the device each one runs on.

``torchrun --nproc_per_node=N -m attnkit COMMAND ...`` starts N copies; each reads RANK / WORLD_SIZE /
LOCAL_RANK from the environment and joins the group (:func:`init_world`): NCCL on GPUs, gloo on CPUs
(used by the tests). One process alone is a world of one, and every collective is then the identity.
Training shares its batches and weights over the group (train/distributed.py); inference gives each
process its share of the input (:func:`share`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

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


PREPARE_MINUTES = 120  # how long processes wait for those preparing the data (World.in_turns)
T = TypeVar("T")


@dataclass
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    preparing: Any = None  # a gloo group whose barrier waits PREPARE_MINUTES (see init_world)

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

    def in_turns(self, prepare: Callable[[], T]) -> T:
        """``prepare()`` in every process, in three turns: rank 0; then the first process of every other
        machine (which finds rank 0's token store on a shared file system, or builds its machine's own);
        then all the others, which find what their machine's first process left. A process that waits
        does so in the long-waiting group of :func:`init_world`."""
        turn = 0 if self.rank == 0 else 1 if self.local_rank == 0 else 2
        result = None
        for now in range(3 if self.size > 1 else 1):
            if now == turn:
                result = prepare()
            if self.size > 1:
                dist.barrier(group=self.preparing)
        return result

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
    # Preparing the data (a token store) can take many minutes, longer than NCCL's default timeout of
    # 10: the processes that wait for it wait in a gloo group of their own, so that the training
    # collectives keep their short timeout.
    preparing = dist.new_group(backend="gloo", timeout=timedelta(minutes=PREPARE_MINUTES))
    world = World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)), preparing)
    if device_kind == "cuda":
        torch.cuda.set_device(world.local_rank)
    return world


def share(n: int, world: World) -> slice:
    """This process's contiguous share of ``n`` items (inference under torchrun): near-equal slices in
    rank order, so that the shares put together in rank order are the items in order."""
    return slice(n * world.rank // world.size, n * (world.rank + 1) // world.size)


def close_world(world: World) -> None:
    """End the process group now, with its threads, while the interpreter is whole (nothing else may
    hold it then: drop the DistributedDataParallel wrapper first)."""
    world.preparing = None  # our reference would keep that group's threads alive
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
