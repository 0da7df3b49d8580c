"""Normalisers: how raw attention scores become weights.

Each normaliser maps scores ``(..., T_q, T_k)`` and a boolean mask (``True`` = may attend, see masks.py)
to weights of the same shape. Masked positions get exactly zero weight under every normaliser, and a
query whose keys are all masked gets an all-zero row (never NaN).

Variants are chosen by name (``normaliser="relu"``) through the small table :data:`NORMALISERS`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

Normaliser = Callable[[Tensor, "Tensor | None"], Tensor]


def _attendable_keys(scores: Tensor, mask: Tensor | None) -> Tensor:
    """How many keys each query may attend to, ``(..., T_q, 1)``, at least 1 (to divide by)."""
    if mask is None:
        return torch.full((1,), scores.size(-1), dtype=scores.dtype, device=scores.device)
    count = mask.expand(scores.shape).sum(-1, keepdim=True).to(scores.dtype)
    return count.clamp(min=1)


def _zero_masked(weights: Tensor, mask: Tensor | None) -> Tensor:
    return weights if mask is None else weights.masked_fill(~mask, 0.0)


def softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """``softmax(s)_j = exp(s_j) / Σ_k exp(s_k)`` over the attendable keys (Vaswani et al., 2017, eq. 1).

    Masked scores are set to the dtype's lowest finite value rather than ``-inf`` so that a fully
    masked row stays finite (uniform) before it is zeroed; partially masked rows are unchanged because
    ``exp(lowest - max)`` underflows to exactly 0.
    """
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return _zero_masked(scores.softmax(dim=-1), mask)


def relu(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """``relu(s_j) / L``, with ``L`` the number of attendable keys.

    ReLU attention scaled by sequence length, as in Wortsman et al. (2023), "Replacing softmax with ReLU
    in Vision Transformers" (arXiv:2309.08586); the division keeps the expected row sum O(1) like softmax.
    """
    return _zero_masked(F.relu(scores), mask) / _attendable_keys(scores, mask)


def gelu(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """``gelu(s_j) / L``: the point-wise-activation family of Wortsman et al. (2023) with GELU.

    Unlike ReLU the weights can be slightly negative; Hua et al. (2022) and Wortsman et al. compare such
    activations as drop-in replacements for softmax.
    """
    return _zero_masked(F.gelu(scores), mask) / _attendable_keys(scores, mask)


def sigmoid(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """``σ(s_j + b)`` with ``b = -log n``, ``n`` the number of attendable keys.

    Sigmoid attention of Ramapuram et al. (2024), "Theory, Analysis, and Best Practices for Sigmoid
    Self-Attention" (arXiv:2409.04431): each weight is independent of the others, and the bias
    ``-log n`` keeps the initial row sum near 1, which they show is needed for stable training.
    """
    bias = -torch.log(_attendable_keys(scores, mask))
    return _zero_masked(torch.sigmoid(scores + bias), mask)


NORMALISERS: dict[str, Normaliser] = {
    "softmax": softmax,
    "relu": relu,
    "gelu": gelu,
    "sigmoid": sigmoid,
}


def get_normaliser(name: str) -> Normaliser:
    """The normaliser called ``name``; a clear error lists the choices."""
    try:
        return NORMALISERS[name]
    except KeyError:
        raise ValueError(f"unknown normaliser {name!r}; choose one of {sorted(NORMALISERS)}") from None
