"""Several processes through ``torchrun``: DistributedDataParallel with rank-aware batches.

``torchrun --nproc_per_node=N -m attnkit train ...`` starts N copies; each reads RANK / WORLD_SIZE /
LOCAL_RANK from the environment. Every optimizer step consumes ``update_freq × world_size`` batches and
rank r takes every world_size-th of them, so N processes with ``update_freq=1`` see the same global batch
as one process with ``update_freq=N``. The loss is divided by the *global* number of target tokens, so
the averaged gradient is the same too. NCCL on GPUs, gloo on CPUs (used by the tests).

How the processes hold the model (``train.parallel``): DDP keeps all of it in each and averages the
gradients; FSDP2 (``fully_shard``, Zhao et al. 2023) keeps 1/N of every weight, gradient and optimizer
state in each, gathers a layer's weights just before it runs and frees them after, so a model N times
too big for one device trains; the updates are the same as DDP's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


def fully_shard_model(model: torch.nn.Module, world: World, device: torch.device,
                      param_dtype: torch.dtype | None) -> None:  # fmt: skip
    """Shard ``model`` in place over the processes (FSDP2): each layer of every stack (an encoder's or
    decoder's ``layers``) is a unit whose weights are gathered together, the rest (embeddings, output,
    final norms) the root unit. The model may be on the CPU: each unit's weights go to ``device`` as
    it is sharded, so only one unit is ever whole there. ``param_dtype`` (bf16): the gathered weights'
    type for computing, while the kept shards, the gradients' reduction and the optimizer stay in
    float32 (mixed precision)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world.size,))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList):
            for layer in layers:
                fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


@contextmanager
def whole_root(model: torch.nn.Module) -> Iterator[None]:
    """The root unit's weights gathered in every process for the block (a sharded model), as when
    decoding calls its parts (``encode``, the output layer) without its ``forward``; each layer still
    gathers its own when it runs, so every process must run the same steps (all validate the same)."""
    if not hasattr(model, "unshard"):  # not sharded
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


def share(n: int, world: World) -> slice:
    """This process's contiguous share of ``n`` items (inference under torchrun): near-equal slices in
    rank order, so that the shares put together in rank order are the items in order."""
    return slice(n * world.rank // world.size, n * (world.rank + 1) // world.size)


def shard(group: list[Any], world: World) -> list[Any]:
    """This rank's share of one optimizer step's batches."""
    return group[world.rank :: world.size]


def close_world(world: World) -> None:
    """End the process group now, with its threads, while the interpreter is whole (nothing else may
    hold it then: drop the DistributedDataParallel wrapper first)."""
    world.preparing = None  # our reference would keep that group's threads alive
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
