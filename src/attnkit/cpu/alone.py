"""Attention in which each row gets what it would get alone: the same sums in the same order, whatever
its batchmates, their lengths and the number of threads (docs/invariance.md).

torch's fused CPU kernel (``F.scaled_dot_product_attention``) gives a row other bits in another batch,
in two ways (``tests/cpu/test_alone.py`` finds both):

- its sums over the keys run over all the keys of the padded batch, the padded ones (weight exactly 0)
  included, in an order (vector lanes, blocks of keys and of queries) that depends on the padded
  length: the same row padded to 20 keys or to 40 sums its weights and values in another order;
- for a single query per row, it splits the keys between threads when the batch has few rows, and adds
  the parts in another order than one thread does.

So for inference, :func:`attend_as_alone` gives every row keys of a length fixed by its own: its real
keys padded to the next multiple of :data:`KEY_BUCKET`, and calls the fused kernel once for each group
of rows of the same such length. In self-attention over a padded batch (an encoder's), the queries are
cut to that length too, the rest of the output being padding. A single query is sent twice (two queries
take the kernel's path that splits nothing between threads) and the second answer dropped. A sentence
alone gets the same shapes, so the same sums. The batches ``translate`` makes are sorted by length, so
they hold one or two groups of consecutive rows: slices of the batch, not copies.

The layouts it handles are the ones whose real keys come first in each row: sources padded on the right,
and keys with no mask at all (every row sees every key: a beam search's own past, in which every row
is at the same step). Other masks (padding on the left, a mask per query) return None, and the caller
takes the fused kernel as it is.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

KEY_BUCKET = 8  # each row's keys are padded to a multiple of this many


def key_lengths(mask: Tensor | None, batch: int, t_k: int) -> Tensor | None:
    """Each row's number of real keys ``(B,)`` where ``mask`` (boolean, ``(B or 1, 1, 1, T_k)``, True =
    may attend) marks a prefix of the keys in every row; all ``t_k`` without a mask; None otherwise."""
    if mask is None:
        return torch.full((batch,), t_k, dtype=torch.long)
    if mask.dim() != 4 or mask.shape[1:3] != (1, 1):
        return None
    valid = mask[:, 0, 0, :].expand(batch, t_k)  # (B, T_k)
    lengths = valid.sum(-1)  # (B,)
    prefix = torch.arange(t_k, device=mask.device)[None, :] < lengths[:, None]  # (B, T_k)
    return lengths if bool(torch.equal(valid, prefix)) else None


def _groups(buckets: Tensor) -> Iterator[tuple[int, Tensor | slice]]:
    """``(bucket, rows)`` for each bucket length in ``buckets (B,)``: the rows as a slice where they are
    consecutive, else as an index."""
    if bool((buckets[1:] >= buckets[:-1]).all()):  # sorted: runs of consecutive rows
        values, counts = torch.unique_consecutive(buckets, return_counts=True)
        start = 0
        for value, count in zip(values.tolist(), counts.tolist(), strict=True):
            yield value, slice(start, start + count)
            start += count
        return
    for value in torch.unique(buckets).tolist():
        yield value, (buckets == value).nonzero().squeeze(1)


def _padded_to(x: Tensor, length: int) -> Tensor:
    """``x (..., T, d)`` cut or padded with zeros to ``length`` positions."""
    if x.size(-2) >= length:
        return x[..., :length, :]
    return F.pad(x, (0, 0, 0, length - x.size(-2)))


def attend_as_alone(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None, queries_are_keys: bool
) -> Tensor | None:
    """``softmax(scale · q kᵀ) v`` (eq. 1), each row's output what it would be alone (see the module
    docstring); None where ``mask`` is not a layout this handles. ``q (B, h, T_q, d_k)``, ``k`` and
    ``v (B, h, T_k, d_k)``; ``mask`` boolean ``(B or 1, 1, 1, T_k)`` or None; ``scale`` None for
    ``1/√d_k``; ``queries_are_keys``: self-attention over padded positions, whose queries past a row's
    real length are padding (their output: zeros or whatever a lone row's padding gets)."""
    B, _, T_q, _ = q.shape
    T_k = k.size(-2)
    lengths = key_lengths(mask, B, T_k)
    if lengths is None:
        return None
    # without a mask every row's length is the step's, the same alone: no padding to add
    buckets = lengths if mask is None else (lengths.clamp(min=1) + KEY_BUCKET - 1) // KEY_BUCKET * KEY_BUCKET
    out = q.new_zeros(q.shape) if queries_are_keys else q.new_empty(q.shape)  # (B, h, T_q, d_v)
    for bucket, rows in _groups(buckets):
        q_rows, k_rows, v_rows = q[rows], _padded_to(k[rows], bucket), _padded_to(v[rows], bucket)
        if queries_are_keys:
            q_rows = _padded_to(q_rows, bucket)
        single = q_rows.size(-2) == 1
        if single:  # (n, h, 1, d_k) -> (n, h, 2, d_k): the path that splits no keys between threads
            q_rows = q_rows.expand(-1, -1, 2, -1)
        row_mask = None if mask is None else (torch.arange(bucket) < lengths[rows, None])[:, None, None, :]
        got = F.scaled_dot_product_attention(q_rows, k_rows, v_rows, attn_mask=row_mask, scale=scale)
        got = got[..., :1, :] if single else got[..., : min(T_q, bucket), :]  # (n, h, ≤T_q, d_v)
        out[rows, :, : got.size(-2)] = got
    return out
