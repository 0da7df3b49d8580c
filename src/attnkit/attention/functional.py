"""``attend``: the one function every attention in attnkit goes through.

``Attention(Q, K, V) = normalise(score(Q, K)) V`` (Vaswani et al., 2017, eq. 1, with the score and the
normaliser as choices). Two paths compute it:

- the **reference path**, which reads like the maths: scores, mask, normalise, dropout, weighted sum;
- the **fast path**, ``F.scaled_dot_product_attention`` (fused kernels on CPU and GPU), taken whenever it
  computes the same thing: dot or scaled-dot scores, softmax, and no request for the weights (fused
  kernels never materialise them); in a CPU decoding step (at most ``FEW_QUERIES`` queries, no gradient)
  the same softmax is multiplied out in two matrix products, which is faster there than the kernel's
  blocked loop. Tests prove the paths equal. With dropout on a CPU, the fused
  kernels do not apply and ``F.scaled_dot_product_attention`` computes the reference path's steps
  itself; attnkit then takes the reference path, whose dropout draws its random numbers more cheaply
  (dropout.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.attention.dropout import dropout
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
    fast = (
        not need_weights
        and normaliser == "softmax"
        and isinstance(score, str)
        and score in _FAST_SCORE_SCALE
        and not (dropout_p > 0.0 and q.is_cpu)  # see below
    )
    if fast and causal and mask is None and q.size(-2) == k.size(-2):  # SDPA's is_causal: square only
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=True, scale=_FAST_SCORE_SCALE[score]
        )
        return out, None
    if causal:
        mask = combine_masks(mask, causal_mask(q.size(-2), k.size(-2), device=q.device))
    if fast and dropout_p == 0.0 and few_queries_on_cpu(q, k, v):
        return _attend_few_queries(q, k, v, mask, _FAST_SCORE_SCALE[score]), None
    if fast:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=_FAST_SCORE_SCALE[score]
        )
        return out, None
    return attend_reference(
        q, k, v, mask, score=score, normaliser=normaliser, dropout_p=dropout_p, need_weights=need_weights
    )


FEW_QUERIES = 8  # decoding steps: one query per row, or one per beam where beams share their keys


def few_queries_on_cpu(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether :func:`attend`'s fast path multiplies out the softmax itself (see
    :func:`_attend_few_queries`): at most :data:`FEW_QUERIES` queries per row, on a CPU, no gradient."""
    return (
        q.size(-2) <= FEW_QUERIES
        and q.is_cpu
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
    )


def _attend_few_queries(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None) -> Tensor:
    """``softmax(q kᵀ · scale) v`` as two matrix products, for a decoding step on a CPU: PyTorch's fused
    CPU kernel works through blocks of queries, and with 1-8 of them its set-up costs more than the
    products. Measured on 2 cores for the Multi30k model's beam search (4 heads of 64): one query per
    row over 10 and 25 cached keys, 160 rows, 1.3x and 1.5x slower; five beams' queries over 15 and 30
    masked source positions, 32 rows, 2.0x and 2.4x. A query with no attendable key gets zeros, as on
    the other paths."""
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(q.size(-1) ** -0.5 if scale is None else scale)
    if mask is None:
        return torch.matmul(scores.softmax(-1), v)
    weights = scores.masked_fill_(~mask, float("-inf")).softmax(-1).nan_to_num_(0.0)  # no key: 0/0 -> 0
    return torch.matmul(weights, v)


def attend_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    score: str | ScoreFn = "scaled_dot",
    normaliser: str = "softmax",
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The reference path of :func:`attend`, step by step as in the paper; same arguments."""
    scores = resolve_score(score)(q, k)  # (..., T_q, T_k)
    weights = get_normaliser(normaliser)(scores, mask)  # masked keys get exactly 0
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    out = weights @ v  # (..., T_q, d_v)
    return out, (weights if need_weights else None)
