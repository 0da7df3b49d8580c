"""Which precision a run trains in: ``train.precision`` resolved for its device, with the reason, for the
run's first lines and its ``config.json``.

``auto`` is bf16 autocast on a GPU, and on a CPU whose bf16 matrix products are fast
(:func:`attnkit.cpu.precision.matrix_units` finds the units, AMX or AVX512-BF16, and times a product):
there bf16 trains about 1.6-1.8x float32's tokens a second to the same validation loss
(bench/train_speed.py ``--precision``; the figures are in docs/benchmarks.md). Elsewhere (a CPU without
such units, which emulates bf16, or another device) it is float32. ``train.precision=fp32`` keeps
float32 anywhere. Under autocast
the weights, gradients and the optimizer's state stay float32 (mixed precision: Micikevicius et al.,
2018, with bf16's range needing no loss scaling), the matrix products run in bf16, and the losses'
log-softmax in float32 (tasks/losses.py).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial

import torch

from attnkit.cpu.precision import matrix_units


def training_precision(precision: str, device: torch.device) -> tuple[torch.dtype | None, str]:
    """The dtype the training step autocasts to (None: float32 throughout) for ``train.precision`` on
    ``device``, and one line that says which and why."""
    if precision == "fp32":
        return None, "fp32 (train.precision=fp32)"
    if precision == "bf16":
        return torch.bfloat16, "bf16 autocast (train.precision=bf16)"
    if device.type == "cuda":
        return torch.bfloat16, "bf16 autocast (train.precision=auto: a GPU)"
    units = matrix_units() if device.type == "cpu" else None
    if units is not None and units.bf16:
        return torch.bfloat16, f"bf16 autocast (train.precision=auto: {units.why})"
    if units is not None:
        return None, f"fp32 (train.precision=auto: {units.why})"
    return None, f"fp32 (train.precision=auto on a {device.type.upper()})"


def autocast_for(device: torch.device, dtype: torch.dtype | None) -> Callable[[], AbstractContextManager]:
    """The context every forward pass of the run enters (its training steps' and its validations'):
    autocast to ``dtype`` on ``device``, or nothing when the run trains in float32."""
    if dtype is None:
        return nullcontext
    return partial(torch.autocast, device.type, dtype=dtype)
