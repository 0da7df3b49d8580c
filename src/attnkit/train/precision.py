"""Which precision a run trains in: ``train.precision`` resolved for its device, with the reason, for the
run's first lines and its ``config.json``.

``auto`` is bf16 autocast on a GPU, and on a CPU whose bf16 matrix products are fast
(:func:`attnkit.cpu.precision.matrix_units` finds the units, AMX or AVX512-BF16, and times a product):
there bf16 trains about 1.6-1.8x float32's tokens a second to the same validation loss
(bench/train_speed.py ``--precision``; the figures are in docs/benchmarks.md). But a small model's
products are too short to repay the casts: an RNN of 128 hidden units trained 0.86x float32's tokens a
second in bf16, a Transformer of d_model 64 0.90-0.97x. So on such a CPU, a run of one process times a
training step of its first batch both ways (:func:`faster_of_two`) and keeps bf16 only where it is at
least :data:`BF16_AT_LEAST` times faster; the run's config.json records the choice, so that a resumed
run keeps it. Elsewhere (a CPU without such units, which emulates bf16, or another device) it is
float32. ``train.precision=fp32`` keeps float32 anywhere, ``bf16`` bf16. Under autocast
the weights, gradients and the optimizer's state stay float32 (mixed precision: Micikevicius et al.,
2018, with bf16's range needing no loss scaling), the matrix products run in bf16, and the losses'
log-softmax in float32 (tasks/losses.py).
"""

from __future__ import annotations

import statistics
import time
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


# bf16 is kept where a training step is at least this much faster in it than in float32 (else float32,
# whose sums are the more exact); and the steps timed each way, alternated, after one each to warm up
BF16_AT_LEAST = 1.1
TIMED_STEPS = 3


def measured_on(precision: str, device: torch.device, dtype: torch.dtype | None, processes: int) -> bool:
    """Whether ``train.precision`` (resolved to ``dtype``) is chosen by timing a step both ways: ``auto``
    on a CPU with fast bf16 units, in a run of one process (the processes of a larger run would have
    to agree on their timings first)."""
    return precision == "auto" and device.type == "cpu" and dtype is not None and processes == 1


def faster_of_two(
    step: Callable[[Callable[[], AbstractContextManager]], None],
) -> tuple[torch.dtype | None, str]:
    """bf16 autocast or float32 (None), whichever trains faster by the rule of :data:`BF16_AT_LEAST`,
    and one line that says which with the times; ``step(autocast)`` runs one training step's forward and
    backward pass in the context ``autocast()`` (its gradients are the caller's to clear)."""
    contexts = {dtype: autocast_for(torch.device("cpu"), dtype) for dtype in (None, torch.bfloat16)}
    times: dict[torch.dtype | None, list[float]] = {dtype: [] for dtype in contexts}
    for round_ in range(TIMED_STEPS + 1):
        for dtype, context in contexts.items():
            began = time.perf_counter()
            step(context)
            if round_:  # the first round warms up
                times[dtype].append(time.perf_counter() - began)
    fp32, bf16 = (statistics.median(times[dtype]) * 1000 for dtype in contexts)
    took = f"a training step of the first batch took {bf16:.1f} ms in bf16 against {fp32:.1f} ms in float32"
    if fp32 >= BF16_AT_LEAST * bf16:
        return torch.bfloat16, f"bf16 autocast (train.precision=auto: {took})"
    return None, f"fp32 (train.precision=auto: {took}; bf16 is taken from {BF16_AT_LEAST}x faster)"


def autocast_for(device: torch.device, dtype: torch.dtype | None) -> Callable[[], AbstractContextManager]:
    """The context every forward pass of the run enters (its training steps' and its validations'):
    autocast to ``dtype`` on ``device``, or nothing when the run trains in float32."""
    if dtype is None:
        return nullcontext
    return partial(torch.autocast, device.type, dtype=dtype)
