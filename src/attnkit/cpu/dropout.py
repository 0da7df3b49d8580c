"""Dropout (Srivastava et al., 2014) with cheaper random numbers on CPU: :class:`FastDropout`, which
:func:`attnkit.cpu.speed_up` swaps in for every ``nn.Dropout`` of a model, and :func:`dropout`, which it
gives multi-head attention for its weights.

``dropout(x, p)`` zeroes each entry with probability p and scales the rest by 1/(1-p), as
``F.dropout``. On a CPU, ``F.dropout`` draws one random float per entry (``bernoulli_``), a noticeable
share of a training step on a 2-core machine: GPT-2's attention weights alone are 3 million entries per
layer. Here each 64-bit draw of torch's generator gives four entries 16 random bits each, and an entry
is kept when its 16 bits are at or above ``p`` in 2^-16 steps: four times fewer generator calls, and a
cheaper mask, forward and backward (docs/benchmarks.md has the figures).

The one difference from ``F.dropout``: the drop probability is p rounded to a multiple of 2^-16
(0.1 becomes 0.1000061), and the kept entries are scaled by the exact inverse of the resulting keep
probability, so the expected output is still ``x``. Everywhere else (GPUs, whose dropout kernel is fused
and fast; ``torch.compile``, which generates its own; p = 1) it is ``F.dropout``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LANES = 65536  # values of a 16-bit lane


def _dropped_lanes(p: float) -> int:
    """How many of a lane's 2^16 values drop an entry: p rounded to a multiple of 2^-16, times 2^16."""
    return round(p * _LANES)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> Tensor:
    """A boolean tensor of ``shape``: True with probability ``1 - round(p·2^16)/2^16`` per entry."""
    n = math.prod(shape)
    words = torch.empty(-(-n // 4), dtype=torch.int64, device=device).random_(-(2**63), None)  # 64 bits each
    lanes = words.view(torch.int16)[:n].view(shape)  # four uniform 16-bit integers per word, in [-2^15, 2^15)
    return lanes >= _dropped_lanes(p) - _LANES // 2


def _fast_applies(x: Tensor, p: float) -> bool:
    return x.is_cpu and x.is_floating_point() and p < 1.0 and not torch.compiler.is_compiling()


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)``, with the cheaper mask where it applies (see the module docstring)."""
    if not training or p == 0.0:
        return x
    if not _fast_applies(x, p):
        return F.dropout(x, p, training=True)
    scale = _LANES / (_LANES - _dropped_lanes(p))  # 1 / the keep probability
    return torch.where(keep_mask(x.shape, p, x.device), x, 0.0).mul_(scale)


class FastDropout(nn.Dropout):
    """``nn.Dropout`` whose forward is :func:`dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


def as_fast_dropout(model: nn.Module) -> int:
    """Make every plain ``nn.Dropout`` of ``model`` a :class:`FastDropout`, in place; returns how many."""
    layers = [module for module in model.modules() if type(module) is nn.Dropout]
    for layer in layers:
        layer.__class__ = FastDropout
    return len(layers)
