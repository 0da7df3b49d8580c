"""Learning-rate schedules, as functions of the optimizer step (1-based).

- ``noam``: the paper's eq. 3, ``lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)``, times a
  factor (the Annotated Transformer's ``rate()``): linear warm-up, then decay with the inverse square root.
- ``inverse_sqrt``: the same shape, parameterised by its peak (fairseq's): ``peak · min(step / warmup,
  sqrt(warmup / step))``.
- ``cosine``: nanoGPT's: a linear warm-up to ``peak``, then half a cosine down to ``min_lr`` at
  ``decay_steps``, then ``min_lr`` (Loshchilov & Hutter, 2017, without restarts).
- ``constant``: ``peak`` after a linear warm-up.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from attnkit.config import SCHEDULES
from attnkit.errors import ConfigError


def noam(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt(step: int, peak: float, warmup: int) -> float:
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


def cosine(step: int, peak: float, warmup: int, decay_steps: int, min_lr: float = 0.0) -> float:
    """nanoGPT's ``get_lr(it)`` with ``it = step - 1`` (its iterations count from 0)."""
    it = step - 1
    if it < warmup:
        return peak * (it + 1) / (warmup + 1)
    if it > decay_steps:
        return min_lr
    progress = (it - warmup) / max(decay_steps - warmup, 1)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - min_lr)


def constant(step: int, peak: float, warmup: int) -> float:
    return peak * min(1.0, max(step, 1) / max(warmup, 1))


def learning_rate_fn(
    name: str, lr: float, warmup: int, d_model: int, decay_steps: int = 0, min_lr: float = 0.0
) -> Callable[[int], float]:
    """``step -> learning rate`` for the schedule called ``name``."""
    if name == "noam":
        return lambda step: noam(step, d_model, warmup, lr)
    if name == "inverse_sqrt":
        return lambda step: inverse_sqrt(step, lr, warmup)
    if name == "cosine":
        return lambda step: cosine(step, lr, warmup, decay_steps, min_lr)
    if name == "constant":
        return lambda step: constant(step, lr, warmup)
    raise ConfigError(f"train.schedule must be one of {SCHEDULES}, got {name!r}")


def make_scheduler(optimizer: Optimizer, rate: Callable[[int], float]) -> LambdaLR:
    """A scheduler setting the learning rate to ``rate(step)``; the optimizer's base lr must be 1."""
    return LambdaLR(optimizer, lambda index: rate(index + 1))
