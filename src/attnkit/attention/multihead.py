"""Multi-head attention (Vaswani et al., 2017, §3.2.2) with a KV cache for incremental decoding.

``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O``,
``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)``.
The h projections of each kind are one ``d_model x d_model`` matrix, and the three kinds are stacked
into one ``in_proj`` of ``3·d_model`` rows (the layout of ``torch.nn.MultiheadAttention``): self-attention
projects Q, K and V with a single matrix multiply, cross-attention projects K and V together.

``normaliser`` turns scores into weights (softmax, the paper's, or relu / gelu / sigmoid: see
normalisers.py); ``window`` > 0 makes self-attention local, each query seeing only the keys within
``window`` positions of it (Luong et al.'s local attention with p_t = t, the sliding window of
Longformer and Mistral when combined with a causal mask). Cross-attention always sees the whole memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.attention.functional import attend
from attnkit.attention.local import attend_local
from attnkit.attention.masks import local_window_mask
from attnkit.attention.recording import recording_of


class KVCache:
    """Keys and values one attention layer has already computed, ``(B, h, T_cached, d_k)`` each.

    Self-attention appends the new step's keys and values; cross-attention fills it once from the
    encoder memory and reuses it at every later step. ``reorder`` (beam search's re-ranking, or
    dropping finished rows) is applied when the cache is next read or appended to: an append after a
    reorder then gathers the kept rows straight into the extended tensor, one copy of the cache per
    step instead of two (``index_select``, then ``torch.cat``).
    """

    def __init__(self, key: Tensor | None = None, value: Tensor | None = None) -> None:
        self._key, self._value = key, value
        self._order: Tensor | None = None  # rows to keep, not yet applied

    @property
    def key(self) -> Tensor | None:
        self._apply_order()
        return self._key

    @property
    def value(self) -> Tensor | None:
        self._apply_order()
        return self._value

    def __len__(self) -> int:
        return self.positions()

    def positions(self) -> int:
        """``len(self)``, but a symbol where ``torch.export`` traces the cached length as one (``len()``
        must return a plain int, which would fix the length to the traced example's)."""
        return 0 if self._key is None else self._key.size(-2)

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Add new positions and return all keys and values so far."""
        if self._key is not None:
            order, self._order = self._order, None
            key, value = _extended(self._key, key, order), _extended(self._value, value, order)
        self._key, self._value = key, value
        return key, value

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (in that order), as beam search does when hypotheses are re-ranked."""
        if self._key is not None:
            self._order = index if self._order is None else self._order.index_select(0, index)

    def held(self) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """``(key, value, order)`` as held: the rows to keep (``order``, None for all) not yet picked
        from the keys and values, for a step that picks them itself as it extends them (the compiled
        decoding step: one copy of the cache per step, as :meth:`append` makes)."""
        return self._key, self._value, self._order

    def hold(self, key: Tensor, value: Tensor, order: Tensor | None = None) -> None:
        """Hold ``key`` and ``value`` in place of the cache's, ``order`` the rows of them to keep when
        next read or extended (None: all): what :meth:`held` gives, or a step's extended cache."""
        self._key, self._value, self._order = key, value, order

    def _apply_order(self) -> None:
        if self._order is not None:
            self._key = self._key.index_select(0, self._order)
            self._value = self._value.index_select(0, self._order)
            self._order = None


def _extended(cached: Tensor, new: Tensor, order: Tensor | None) -> Tensor:
    """``torch.cat([cached[order], new], dim=-2)`` in one pass: ``(B, h, T + T_new, d_k)`` (in two
    where autograd tracks them: ``index_select(out=...)`` has no gradient)."""
    if torch.is_grad_enabled() and (cached.requires_grad or new.requires_grad):
        return torch.cat([cached if order is None else cached.index_select(0, order), new], dim=-2)
    T = cached.size(-2)
    out = new.new_empty(new.size(0), new.size(1), T + new.size(-2), new.size(-1))
    if order is None:
        out[:, :, :T].copy_(cached)
    else:
        torch.index_select(cached, 0, order, out=out[:, :, :T])  # the kept rows, gathered in place
    out[:, :, T:].copy_(new)
    return out


class MultiHeadAttention(nn.Module):
    """h attention heads over learned projections of d_model-sized queries, keys and values.

    Call as ``mha(x, mask=...)`` for self-attention or ``mha(x, memory, mask=...)`` for
    cross-attention (keys and values both come from ``memory``). The mask is broadcastable to
    ``(B, T_q, T_k)``, ``True`` = may attend; the same mask applies to every head.
    """

    # What it applies itself (everything else is a module): the linear map of a block of in_proj's rows
    # (project_rows: cross-attention's W^Q, and W^K, W^V together), and dropout on the attention weights.
    # A subclass may bring others with the same arithmetic, as attnkit.cpu does for CPUs.
    drop_weights = staticmethod(F.dropout)

    def __init__(
        self,
        d_model: int,
        h: int,
        dropout: float = 0.0,
        bias: bool = True,
        *,
        score: str = "scaled_dot",
        normaliser: str = "softmax",
        window: int = 0,
    ) -> None:
        super().__init__()
        if d_model % h != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by the number of heads h ({h})")
        self.d_model, self.h, self.d_k = d_model, h, d_model // h
        self.dropout = dropout
        self.score, self.normaliser = score, normaliser
        if window < 0:
            raise ValueError(f"window must be >= 0 (0 = attend to every key), got {window}")
        self.window = window  # self-attention only: each query sees the keys within `window` positions
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)  # rows: [W^Q; W^K; W^V]
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O

    def forward(
        self,
        query: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        cache: KVCache | None = None,
        need_weights: bool = False,
        causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend; returns ``(output (B, T_q, d_model), per-head weights (B, h, T_q, T_k) or None)``.

        ``causal``: also hide later positions, without a mask tensor (see :func:`attend`)."""
        q, k, v = self._project(query, memory, cache)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(-3)  # (B, T_q, T_k) -> (B, 1, T_q, T_k): same mask for every head
        recorder = recording_of(self)  # a plot or the explorer wants this call's weights (recording.py)
        weights_wanted = need_weights or recorder is not None
        if k.size(0) != q.size(0):  # a cache shared by groups of consecutive query rows (see _shared)
            if not weights_wanted:
                return self._merge_heads(self._shared(q, k, v, mask)), None
            groups = q.size(0) // k.size(0)  # weights per row wanted: the ordinary path, keys repeated
            k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)
        if self.window and memory is None:  # local self-attention: a band of keys around each query
            reach = q.size(-2) + self.window  # with a cache, the keys before the last `reach` are out of it
            if k.size(-2) > reach:
                k, v, mask = (
                    k[..., -reach:, :],
                    v[..., -reach:, :],
                    None if mask is None else mask[..., -reach:],
                )
            out = self._local(q, k, v, mask, causal) if not weights_wanted else None
            if out is not None:
                return self._merge_heads(out), None
            band = local_window_mask(q.size(-2), k.size(-2), window=self.window, device=q.device)
            mask = band if mask is None else mask & band
        out, weights = self._attend(q, k, v, mask, need_weights=weights_wanted, causal=causal)
        if recorder is not None:
            recorder.keep(self, weights)
        return self._merge_heads(out), (weights if need_weights else None)

    def _shared(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Cross-attention whose cached keys and values hold one row per group of ``G`` consecutive query
        rows: the beams of one source in beam search, which share its memory. The G rows' queries attend
        to their shared keys together, as one row of G·T_q queries, so the keys are read once, not G
        times; the mask must be the same for the G rows (it is: one source's padding). Returns the
        output ``(B, h, T_q, d_k)``."""
        B, h, T, d_k = q.shape
        G = B // k.size(0)
        grouped = q.view(-1, G, h, T, d_k).transpose(1, 2).reshape(-1, h, G * T, d_k)  # (N, h, G·T, d_k)
        if mask is not None:
            mask = mask[::G]  # (N, 1, T_q or 1, T_k): each group's own
            mask = mask.repeat(1, 1, G, 1) if mask.size(-2) > 1 else mask  # query g·T + t: row t's
        out, _ = self._attend(grouped, k, v, mask)
        return out.view(-1, h, G, T, d_k).transpose(1, 2).reshape(B, h, T, d_k)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        need_weights: bool = False,
        causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Every head's attention (eq. 1) with this module's score, normaliser and dropout (during
        training): ``(B, h, T_q, d_k)`` out, and the weights ``(B, h, T_q, T_k)`` if asked for."""
        return attend(q, k, v, mask, score=self.score, normaliser=self.normaliser,
                      dropout_p=self.dropout if self.training else 0.0, dropout_fn=self.drop_weights,
                      need_weights=need_weights, causal=causal)  # fmt: skip

    def _merge_heads(self, out: Tensor) -> Tensor:
        """Concat(head_1..h) W^O: ``(B, h, T_q, d_k) -> (B, T_q, d_model)``."""
        B, _, T_q, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, T_q, self.d_model))

    def _local(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor | None:
        """Windowed self-attention in blocks (attention/local.py) when it computes what the banded mask
        would: softmax of scaled dot products, as many queries as keys, and a mask that only marks padded
        keys (``(B, 1, 1, T)``); None otherwise (the banded mask then serves)."""
        key_padding_only = mask is None or (mask.dim() == 4 and mask.shape[1:3] == (1, 1))
        if not (self.normaliser == "softmax" and self.score == "scaled_dot" and key_padding_only):
            return None
        if q.size(-2) != k.size(-2):
            return None
        key_valid = None if mask is None else mask[:, 0, 0, :].expand(q.size(0), -1)  # (B, T)
        dropout = self.dropout if self.training else 0.0
        return attend_local(q, k, v, self.window, key_valid, causal=causal, dropout_p=dropout)

    def _project(self, query: Tensor, memory: Tensor | None, cache: KVCache | None) -> tuple[Tensor, ...]:
        """Queries, keys and values split into heads, ``(B, h, T, d_k)`` each, using the cache if given."""
        if memory is None:  # self-attention: one matmul for Q, K and V
            q, k, v = self.in_proj(query).chunk(3, dim=-1)  # (B, T, d_model) each
            k, v = self._split_heads(k), self._split_heads(v)
            if cache is not None:
                k, v = cache.append(k, v)
        else:  # cross-attention: keys and values come from the memory, computed once per sequence
            q = self.project_rows(query, 0, self.d_model)  # W^Q: in_proj's first d_model rows
            if cache is not None and cache.key is not None:
                k, v = cache.key, cache.value
            else:
                k, v = self.memory_keys_values(memory)
                if cache is not None:
                    cache.append(k, v)
        return self._split_heads(q), k, v

    def memory_keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention's keys and values of ``memory (B, S, d_model)``: ``(B, h, S, d_k)`` each, laid
        out as the attention kernel reads them (a decoder cache keeps them for every step)."""
        kv = self.project_rows(memory, self.d_model, 3 * self.d_model)  # W^K and W^V: in_proj's other rows
        k, v = kv.chunk(2, dim=-1)
        return self._split_heads(k).contiguous(), self._split_heads(v).contiguous()

    def project_rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """``x`` times the rows ``start:stop`` of ``in_proj`` (and of its bias)."""
        W, b = self.in_proj.weight, self.in_proj.bias
        return F.linear(x, W[start:stop], None if b is None else b[start:stop])

    def _split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.h, self.d_k).transpose(1, 2)  # (B, T, d_model) -> (B, h, T, d_k)


MultiHeadedAttention = MultiHeadAttention
"""The Annotated Transformer's name, for its readers."""
