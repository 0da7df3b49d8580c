"""``attend``: the one function every attention in attnkit goes through.

``Attention(Q, K, V) = normalise(score(Q, K)) V`` (Vaswani et al., 2017, eq. 1, with the score and the
normaliser as choices). Two paths compute it:

- the **reference path**, which reads like the maths: scores, mask, normalise, dropout, weighted sum;
- the **fast path**, ``F.scaled_dot_product_attention`` (fused kernels on CPU and GPU), taken whenever it
  computes the same thing: dot or scaled-dot scores, softmax, and no request for the weights (fused
  kernels never materialise them). Tests prove the two paths equal. With dropout on a CPU, the fused
  kernels do not apply and ``F.scaled_dot_product_attention`` computes the reference path's steps
  itself; attnkit then takes the reference path, where the caller may bring its own dropout (the CPU
  fast path brings one that draws its random numbers more cheaply).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.attention.masks import causal_mask, combine_masks
from attnkit.attention.normalisers import get_normaliser
from attnkit.attention.scores import ScoreFn, resolve_score

# Scores the fused kernel can compute, as the scale it multiplies qᵀk by (None = its own 1/√d_k).
_FAST_SCORE_SCALE = {"scaled_dot": None, "dot": 1.0}


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    score: str | ScoreFn = "scaled_dot",
    normaliser: str = "softmax",
    dropout_p: float = 0.0,
    dropout_fn: Callable[[Tensor, float], Tensor] = F.dropout,
    need_weights: bool = False,
    causal: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Attend from queries to keys and mix the values.

    Args:
        q: queries ``(..., T_q, d_k)``.
        k: keys ``(..., T_k, d_k)``.
        v: values ``(..., T_k, d_v)``.
        mask: boolean, broadcastable to ``(..., T_q, T_k)``, ``True`` = may attend (see masks.py).
        score: ``"scaled_dot"`` (the paper), ``"dot"``, or a score module such as ``LuongGeneral``.
        normaliser: ``"softmax"``, ``"relu"``, ``"gelu"`` or ``"sigmoid"`` (normalisers.py).
        dropout_p: dropout on the weights; pass 0.0 at evaluation time (as with F.sdpa).
        dropout_fn: how the reference path drops weights, ``dropout_fn(weights, dropout_p)``:
            ``F.dropout``, or another with its contract.
        need_weights: also return the weights ``(..., T_q, T_k)``; forces the reference path.
        causal: each query also sees only keys up to its own position (queries aligned to the end of
            the keys, as :func:`causal_mask`), without a mask tensor: the fused kernels then skip the
            hidden half instead of computing and discarding it.

    Returns:
        ``(output (..., T_q, d_v), weights or None)``. A query with no attendable key outputs zeros.
    """
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(
            f"attention masks are boolean (True = may attend), got dtype {mask.dtype}; convert with "
            "attnkit.attention.masks (e.g. from_hf_attention_mask) instead of passing 0/1 or additive masks"
        )
    fast = fused(q, score=score, normaliser=normaliser, dropout_p=dropout_p, need_weights=need_weights)
    if fast and causal and mask is None and q.size(-2) == k.size(-2):  # SDPA's is_causal: square only
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=True, scale=_FAST_SCORE_SCALE[score]
        )
        return out, None
    if causal:
        mask = combine_masks(mask, causal_mask(q.size(-2), k.size(-2), device=q.device))
    if fast:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=_FAST_SCORE_SCALE[score]
        )
        return out, None
    return attend_reference(
        q, k, v, mask, score=score, normaliser=normaliser, dropout_p=dropout_p, dropout_fn=dropout_fn,
        need_weights=need_weights,
    )  # fmt: skip


def fused(q: Tensor, *, score: str | ScoreFn, normaliser: str, dropout_p: float, need_weights: bool) -> bool:
    """Whether :func:`attend` takes torch's fused kernel (``F.scaled_dot_product_attention``) for these
    settings, rather than the reference path: softmax of (scaled) dot products, no weights wanted, and on
    a CPU no dropout on the weights (see :func:`attend`)."""
    return (
        not need_weights
        and normaliser == "softmax"
        and isinstance(score, str)
        and score in _FAST_SCORE_SCALE
        and not (dropout_p > 0.0 and q.is_cpu)
    )


def attend_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    score: str | ScoreFn = "scaled_dot",
    normaliser: str = "softmax",
    dropout_p: float = 0.0,
    dropout_fn: Callable[[Tensor, float], Tensor] = F.dropout,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The reference path of :func:`attend`, step by step as in the paper; same arguments."""
    scores = resolve_score(score)(q, k)  # (..., T_q, T_k)
    weights = get_normaliser(normaliser)(scores, mask)  # masked keys get exactly 0
    if dropout_p > 0.0:
        weights = dropout_fn(weights, dropout_p)
    out = weights @ v  # (..., T_q, d_v)
    return out, (weights if need_weights else None)
