"""Local (sliding-window) self-attention in blocks: memory and time O(T·w) instead of O(T²).

With a window of ``w``, query ``i`` attends to keys ``j`` with ``|i - j| <= w`` (and ``j <= i`` when
``causal``): Luong et al.'s (2015) local attention with the centre ``p_t = t``, and the sliding window
of Longformer and Mistral. A banded boolean mask over the full ``T × T`` scores (``local_window_mask``)
computes the same thing, but builds and scores all ``T²`` pairs only to discard most of them.

Here the queries are cut into blocks of ``w`` positions. Block ``b`` (queries ``bw .. bw + w - 1``)
can only see keys ``bw - w .. bw + 2w - 1``, so each block attends to those ``3w`` keys (``2w`` when
causal), gathered as a strided view of the keys padded by ``w`` on each side; a small mask per block
keeps exactly the band. ``F.scaled_dot_product_attention`` does the arithmetic, so this is the fast
path of windowed attention (softmax, scaled dot product), tested equal to the banded mask on the
reference path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _blocks(x: Tensor, size: int, step: int) -> Tensor:
    """Overlapping windows of ``size`` positions every ``step``: ``(..., T, d) -> (..., n, size, d)``."""
    return x.unfold(-2, size, step).transpose(-1, -2)


def attend_local(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    key_valid: Tensor | None = None,
    *,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """Windowed self-attention of ``q, k, v (B, h, T, d)``; ``key_valid (B, T)`` marks real (not padded)
    keys. Returns ``(B, h, T, d)``; a query with no key to attend to gets zeros."""
    T, w = q.size(-2), max(window, 1)
    n = -(-T // w)  # blocks of w queries
    right = 0 if causal else w  # keys after the block that a query may see
    span = 2 * w + right  # keys per block: w before, the block's own w, and w after unless causal
    pad_end = n * w - T
    q_blocks = F.pad(q, (0, 0, 0, pad_end)).unflatten(-2, (n, w))  # (B, h, n, w, d)
    k_blocks = _blocks(F.pad(k, (0, 0, w, right + pad_end)), span, w)  # (B, h, n, span, d)
    v_blocks = _blocks(F.pad(v, (0, 0, w, right + pad_end)), span, w)
    # Which (query, key) pairs of each block are in the band: absolute positions bw + i and bw - w + j.
    start = torch.arange(n, device=q.device).view(n, 1, 1) * w
    query_pos = start + torch.arange(w, device=q.device).view(1, w, 1)  # (n, w, 1)
    key_pos = start - w + torch.arange(span, device=q.device).view(1, 1, span)  # (n, 1, span)
    distance = query_pos - key_pos
    band = (distance.abs() <= window) & (key_pos >= 0) & (key_pos < T)  # (n, w, span)
    if causal:
        band = band & (distance >= 0)
    mask = band
    if key_valid is not None:
        valid = _blocks(F.pad(key_valid, (w, right + pad_end)).unsqueeze(-1), span, w)  # (B, n, span, 1)
        mask = band & valid.squeeze(-1).unsqueeze(-2).unsqueeze(1)  # (B, 1, n, w, span)
    out = F.scaled_dot_product_attention(q_blocks, k_blocks, v_blocks, attn_mask=mask, dropout_p=dropout_p)
    return out.flatten(-3, -2)[..., :T, :]  # (B, h, n, w, d) -> (B, h, T, d)
