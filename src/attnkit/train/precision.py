"""Which precision a run trains in: ``train.precision`` resolved for its device, with the reason, for the
run's first lines and its ``config.json``.

``auto`` is bf16 autocast on a GPU and float32 on a CPU; where the CPU has bf16 matrix units
(:func:`attnkit.cpu.precision.matrix_units` finds them: AMX, AVX512-BF16), the line says so, since
``train.precision=bf16`` then trains faster (bench/train_speed.py ``--precision bf16``; the figures are
in docs/benchmarks.md). ``auto`` stays float32 on such CPUs until bf16 is shown to reach float32's
quality on every task (a model trained with REINFORCE learns less well in bf16 today). Under autocast
the weights, gradients and the optimizer's state stay float32 (mixed precision: Micikevicius et al.,
2018, with bf16's range needing no loss scaling), the matrix products run in bf16, and the losses'
log-softmax in float32 (tasks/losses.py).
"""

from __future__ import annotations

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
        return None, f"fp32 (train.precision=auto); {units.why}: train.precision=bf16 trains faster"
    return None, f"fp32 (train.precision=auto on a {device.type.upper()})"
