"""The optimizer's state as a checkpoint holds it: tensors named ``optimizer.{index}.{key}`` (for
safetensors) and plain values (for JSON), ``index`` numbering the parameters in the optimizer's order.

Under FSDP each process holds a slice of every parameter and of its optimizer state; a checkpoint holds
them whole (or as shards any number of processes can read), so loading gives each process its slice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def split_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
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


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The optimizer's state tensors by name (``optimizer.{index}.{key}``), as a checkpoint holds them."""
    return split_state(optimizer)[0]


def _parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters in the order its state numbers them (``optimizer.{index}.{key}``)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def parameter_of(optimizer: torch.optim.Optimizer) -> Callable[[str], torch.Tensor | None] | None:
    """For a sharded optimizer (FSDP), what tells the parameter that a state tensor's name
    (``optimizer.{index}.{key}``) belongs to; None for one that holds whole parameters."""
    parameters = _parameters(optimizer)
    if not any(hasattr(p, "device_mesh") for p in parameters):
        return None
    return lambda name: parameters[int(name.split(".")[1])]


def shard_like(value: torch.Tensor, parameter: torch.Tensor) -> torch.Tensor:
    """``value``, a whole tensor of the optimizer's state for ``parameter``, as ``parameter`` is held:
    this process's slice of it where FSDP shards the parameter (a DTensor), else as it is."""
    sharded = hasattr(parameter, "device_mesh") and not hasattr(value, "device_mesh")
    if not sharded or value.shape != parameter.shape:
        return value
    from torch.distributed.tensor import distribute_tensor

    # every process has the whole tensor: each keeps its slice, nothing is sent (src_data_rank=None)
    return distribute_tensor(
        value.to(parameter.device), parameter.device_mesh, parameter.placements, src_data_rank=None
    )


def load_state(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> None:
    """Load the optimizer's state from whole tensors (a sharded optimizer takes its slices of them) and
    the plain values :func:`split_state` gave (``meta``)."""
    parameters = _parameters(optimizer)
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = shard_like(value, parameters[int(index)])
    for name, value in meta["scalars"].items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
