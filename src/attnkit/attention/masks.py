"""Attention masks: one boolean convention for the whole package.

**Convention: a mask is a boolean tensor broadcastable to (..., T_q, T_k) where ``True`` means the
query may attend to that key.** This matches ``F.scaled_dot_product_attention``'s boolean ``attn_mask``.
Other libraries disagree, a classic source of bugs: ``torch.nn.MultiheadAttention`` uses ``True`` = hidden,
HF transformers uses ``1`` = keep, the Annotated Transformer hides ``mask == 0``. Conversions to and from
those conventions live here and nowhere else.

A query row whose keys are all masked gets exactly zero attention weight and a zero output on every path
of :func:`attnkit.attention.attend`, never NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Keys that are real tokens: ``ids (B, T_k) -> (B, 1, T_k)``, broadcasting over every query."""
    return (ids != pad_id).unsqueeze(-2)


def causal_mask(t_q: int, t_k: int | None = None, *, device: torch.device | str | None = None) -> Tensor:
    """Each query sees itself and earlier keys: ``(T_q, T_k)``.

    With ``t_k > t_q`` the queries are the *last* ``t_q`` positions of a ``t_k``-long sequence, as in
    incremental decoding with a KV cache: query ``i`` sits at absolute position ``t_k - t_q + i``.
    """
    t_k = t_q if t_k is None else t_k
    offset = t_k - t_q
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=offset)


def subsequent_mask(size: int, *, device: torch.device | str | None = None) -> Tensor:
    """The Annotated Transformer's name for the causal mask, with its shape ``(1, size, size)``."""
    return causal_mask(size, device=device).unsqueeze(0)


def local_window_mask(
    t_q: int,
    t_k: int | None = None,
    *,
    window: int,
    causal: bool = False,
    device: torch.device | str | None = None,
) -> Tensor:
    """Keys within ``window`` positions of the query: ``|i - j| <= window`` (``(T_q, T_k)``).

    Local attention in the sense of Luong et al. (2015, §3.2) with a fixed centre, and the sliding
    window of Longformer / Mistral when ``causal=True`` (only the ``window`` keys before the query and
    itself). Queries are aligned to the end of the keys as in :func:`causal_mask`.
    """
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    t_k = t_q if t_k is None else t_k
    query_pos = torch.arange(t_k - t_q, t_k, device=device).unsqueeze(-1)  # (T_q, 1)
    if not causal:
        return keys_near(query_pos, t_k, window)
    distance = query_pos - torch.arange(t_k, device=device)  # (T_q, T_k)
    return (distance >= 0) & (distance <= window)


def keys_near(centre: Tensor, t_k: int, window: float) -> Tensor:
    """Keys ``j`` with ``|j - centre| <= window``: centres ``(..., 1)`` (integer or real) -> ``(..., T_k)``.

    The window of Luong et al.'s local attention (2015, §3.2), ``[p_t - D, p_t + D]``, for a centre
    ``p_t`` that each query (and each sentence) has its own of.
    """
    return (torch.arange(t_k, device=centre.device) - centre).abs() <= window


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of the masks given (``None`` means "no restriction"); broadcasting as usual."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    combined = present[0]
    for mask in present[1:]:
        combined = combined & mask
    return combined


def target_mask(tgt: Tensor, pad_id: int) -> Tensor:
    """Padding and causal mask for a decoder input, ``(B, T) -> (B, T, T)`` (Annotated ``make_std_mask``)."""
    return padding_mask(tgt, pad_id) & causal_mask(tgt.size(-1), device=tgt.device)


# --- conversions at the boundary with other libraries -------------------------------------------------


def to_torch_attn_mask(mask: Tensor) -> Tensor:
    """Our mask as ``torch.nn.MultiheadAttention``'s boolean ``attn_mask`` (``True`` = may *not* attend)."""
    return ~mask


def from_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """PyTorch's ``key_padding_mask (B, T_k)``, ``True`` = padding, as our ``(B, 1, T_k)`` mask."""
    return (~key_padding_mask.bool()).unsqueeze(-2)


def from_hf_attention_mask(attention_mask: Tensor) -> Tensor:
    """HF's ``attention_mask (B, T_k)`` of 1 = keep / 0 = pad, as our ``(B, 1, T_k)`` mask."""
    return attention_mask.bool().unsqueeze(-2)
