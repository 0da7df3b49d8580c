"""Attention in which each row gets what it would get alone: the same sums in the same order, whatever
its batchmates, their lengths and the number of threads (docs/invariance.md).

torch's fused CPU kernel (``F.scaled_dot_product_attention``) gives a row other bits in another batch,
in two ways (``tests/cpu/test_alone.py`` finds both):

- its sums over the keys run over all the keys of the padded batch, the padded ones (weight exactly 0)
  included, in an order (vector lanes, blocks of keys and of queries) that depends on the padded
  length: the same row padded to 20 keys or to 40 sums its weights and values in another order;
- for a single query per row, it splits the keys between threads when the batch has few rows, and adds
  the parts in another order than one thread does.

So for inference, :func:`attend_as_alone` gives every row keys of a length fixed by its own, and calls
the fused kernel once for each group of rows of the same such length, on their keys alone:

- keys padded on the right (:data:`PADDED`, :data:`MEMORY`: a batch of sources, an encoder's memory):
  the row's real keys padded to the next multiple of :data:`KEY_BUCKET`, the padding masked; in
  self-attention over the padded positions (:data:`PADDED`, an encoder's), the queries are cut to that
  length too, the rest of the output being padding;
- a decoder's own past (:data:`PAST`, self-attention with a cache), whose rows may have started at
  other steps and are padded on the left (continuous batching, prompts of several lengths): exactly the
  row's own keys, the last ones, with no mask, as a row that is alone has them; a batch of prompts
  padded on the left (:func:`attend_prompts_as_alone`), each prompt's own positions, causally, as the
  prompt alone is attended.

A decoding step's queries (one per row, or the beams that share one source's memory) are attended by
batched matrix products instead, which sum in one order whatever the batch and the threads. A sentence
alone gets the same shapes, so the same sums.
The batches ``translate`` makes are sorted by length and a running batch's rows by the step they joined
at, so that groups are runs of consecutive rows: slices of the batch, not copies. Other masks (a mask
per query, keys not in one run) return None, and the caller takes the fused kernel as it is.
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.attention.invariance import bucketed, cut_or_padded, groups

# what the keys are (see the module docstring)
PADDED, MEMORY, PAST = "padded", "memory", "past"


def key_lengths(mask: Tensor | None, batch: int, t_k: int, first: bool) -> Tensor | None:
    """Each row's number of real keys ``(B,)`` where ``mask`` (boolean, ``(B or 1, 1, 1, T_k)``, True =
    may attend) marks a run of them in every row: the first ones (``first``) or the last; all ``t_k``
    without a mask; None otherwise."""
    if mask is None:
        return torch.full((batch,), t_k, dtype=torch.long)
    if mask.dim() != 4 or mask.shape[1:3] != (1, 1):
        return None
    valid = mask[:, 0, 0, :].expand(batch, t_k)  # (B, T_k)
    lengths = valid.sum(-1)  # (B,)
    positions = torch.arange(t_k, device=mask.device)[None, :]  # (1, T_k)
    run = positions < lengths[:, None] if first else positions >= t_k - lengths[:, None]  # (B, T_k)
    return lengths if bool(torch.equal(valid, run)) else None


def _by_products(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None) -> Tensor:
    """Eq. 1 for a few queries per row (a decoding step's, or the beams that share one source's
    memory), ``q (n, h, T_q, d_k)``, by batched matrix products, which sum each row in the same order
    whatever the batch and the threads: the fused kernel does not (it splits a single query's keys
    between threads for few rows, and blocks 3 queries, or more than 8 over 8 keys, by the batch: torch
    2.13), and these products are faster than it at these sizes."""
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)).mul_(scale)  # (n, h, T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf"))
    return scores.softmax(-1) @ v  # (n, h, T_q, d_v)


# a row group: its key length, its rows (a slice or an index) and its mask (None: every key real)
Group = tuple[int, "Tensor | slice", "Tensor | None"]
# groups by their mask: a memory's mask is the same data at every step of a decoding (a new view of it
# at each call), so its groups are found once; (where its data is, its shape, strides and version, B,
# T_k, keys) -> (the mask, kept so that its memory is not reused meanwhile; its groups), the oldest
# dropped past PLANS_KEPT
_PLANS: dict[tuple, tuple[Tensor | None, list[Group]]] = {}
_PLANS_LOCK = threading.Lock()
PLANS_KEPT = 64


def _groups_of(mask: Tensor | None, batch: int, t_k: int, keys: str) -> list[Group] | None:
    """The groups of rows that ``mask`` makes (see :func:`attend_as_alone`), found once per mask tensor;
    None where the mask is not a layout this handles."""
    if mask is not None and mask.is_inference():  # made under torch.inference_mode: no version counter
        return _planned(mask, batch, t_k, keys)  # to tell an in-place change by, so found every time
    where = None if mask is None else (mask.data_ptr(), mask.shape, mask.stride(), mask._version)
    key = (where, batch, t_k, keys)
    found = _PLANS.get(key)
    if found is not None:
        return found[1]
    plan = _planned(mask, batch, t_k, keys)
    if plan is not None:
        with _PLANS_LOCK:  # decoding streams are threads: one of them changes the dict at a time
            while len(_PLANS) >= PLANS_KEPT:
                del _PLANS[next(iter(_PLANS))]
            _PLANS[key] = (mask, plan)
    return plan


def _planned(mask: Tensor | None, batch: int, t_k: int, keys: str) -> list[Group] | None:
    lengths = key_lengths(mask, batch, t_k, first=keys != PAST)
    if lengths is None:
        return None
    if keys == PAST:  # the row's own keys, the last ones, all real
        return [(length, rows, None) for length, rows in groups(lengths)]
    # the real keys first, padded to a multiple of KEY_BUCKET
    plan = []
    for length, rows in groups(bucketed(lengths)):
        real = lengths[rows, None]  # (n, 1)
        plan.append((length, rows, (torch.arange(length) < real)[:, None, None, :]))  # (n, 1, 1, length)
    return plan


def attend_as_alone(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None, keys: str
) -> Tensor | None:
    """``softmax(scale · q kᵀ) v`` (eq. 1), each row's output what it would be alone (see the module
    docstring); None where ``mask`` is not a layout this handles. ``q (B, h, T_q, d_k)``, ``k`` and
    ``v (B, h, T_k, d_k)``; ``mask`` boolean ``(B or 1, 1, 1, T_k)`` or None; ``scale`` None for
    ``1/√d_k``; ``keys``: :data:`PADDED` (self-attention over padded positions, whose queries past a
    row's length are padding: their output zeros or whatever a lone row's padding gets), :data:`MEMORY`
    or :data:`PAST`."""
    B, _, T_q, _ = q.shape
    T_k = k.size(-2)
    if keys == PAST and mask is None:  # every row at the same step (a beam search's): one group, as alone
        return (
            _by_products(q, k, v, None, scale)
            if T_q == 1
            else F.scaled_dot_product_attention(q, k, v, scale=scale)
        )
    row_groups = _groups_of(mask, B, T_k, keys)
    if row_groups is None:
        return None
    out = None  # (B, h, T_q, d_v), made where more than one call fills it
    for length, rows, row_mask in row_groups:
        whole = isinstance(rows, slice) and rows == slice(0, B)
        q_rows, k_rows, v_rows = (q, k, v) if whole else (q[rows], k[rows], v[rows])
        if keys == PAST:  # the row's own keys, the last ones, all real
            k_rows, v_rows = k_rows[..., T_k - length :, :], v_rows[..., T_k - length :, :]
        else:
            k_rows, v_rows = cut_or_padded(k_rows, length, -2), cut_or_padded(v_rows, length, -2)
            if keys == PADDED:
                q_rows = cut_or_padded(q_rows, length, -2)
        if keys != PADDED:  # a decoding step's queries
            got = _by_products(q_rows, k_rows, v_rows, row_mask, scale)  # (n, h, T_q, d_v)
        else:
            got = F.scaled_dot_product_attention(q_rows, k_rows, v_rows, attn_mask=row_mask, scale=scale)
            got = got[..., : min(T_q, length), :]  # (n, h, ≤T_q, d_v)
        if len(row_groups) == 1 and got.size(-2) == T_q:  # every row in one call: nothing to assemble
            return got
        if out is None:
            out = q.new_zeros(q.shape) if keys == PADDED else q.new_empty(q.shape)
        out[rows, :, : got.size(-2)] = got
    return out


def attend_prompts_as_alone(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float | None
) -> Tensor | None:
    """Causal self-attention over a batch of prompts padded on the left (a decoder-only model's first
    step), each prompt's output what it is alone, where the fused kernel's own causal masking serves
    (see the module docstring); None where ``mask`` is not that layout. ``q``, ``k``, ``v``
    ``(B, h, T, d_k)``; ``mask (B, 1, T, T)``: each query sees the real keys up to its own position.
    The queries of the padding get zeros."""
    B, _, T, _ = q.shape
    if mask.dim() != 4 or mask.size(1) != 1 or mask.shape[-2:] != (T, T) or k.size(-2) != T:
        return None
    lengths = key_lengths(mask[:, :, -1:, :], B, T, first=False)  # the last query sees all its prompt
    if lengths is None:
        return None
    positions = torch.arange(T, device=mask.device)
    real = positions[None, :] >= T - lengths[:, None]  # (B, T)
    expected = (positions[:, None] >= positions[None, :])[None] & real[:, None, :] & real[:, :, None]
    if not torch.equal(mask[:, 0] & real[:, :, None], expected):
        return None
    out = q.new_zeros(q.shape)  # (B, h, T, d_v)
    for length, rows in groups(lengths):
        own = slice(T - length, T)
        out[rows, :, own] = F.scaled_dot_product_attention(
            q[rows][..., own, :], k[rows][..., own, :], v[rows][..., own, :], is_causal=True, scale=scale
        )
    return out
