"""Training in several processes through ``torchrun``: DistributedDataParallel with rank-aware batches.

``torchrun --nproc_per_node=N -m attnkit train ...`` starts N copies, which join one process group
(attnkit/processes.py). Every optimizer step consumes ``update_freq × world_size`` batches and
rank r takes every world_size-th of them, so N processes with ``update_freq=1`` see the same global batch
as one process with ``update_freq=N``. The loss is divided by the *global* number of target tokens, so
the averaged gradient is the same too.

How the processes hold the model (``train.parallel``): DDP keeps all of it in each and averages the
gradients; FSDP2 (``fully_shard``, Zhao et al. 2023) keeps 1/N of every weight, gradient and optimizer
state in each, gathers a layer's weights just before it runs and frees them after, so a model N times
too big for one device trains; the updates are the same as DDP's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from attnkit.processes import World


def fully_shard_model(
    model: torch.nn.Module, world: World, device: torch.device, param_dtype: torch.dtype | None
) -> None:
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


def shard(group: list[Any], world: World) -> list[Any]:
    """This rank's share of one optimizer step's batches."""
    return group[world.rank :: world.size]
