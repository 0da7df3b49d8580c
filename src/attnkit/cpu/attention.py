"""Multi-head attention with the CPU's faster pieces, the same arithmetic as the paper's module.

:class:`CPUMultiHeadAttention` is :class:`attnkit.attention.MultiHeadAttention` (same parameters, same
state-dict keys) with four changes, each where it pays on a CPU and a no-op elsewhere:

- the blocks of ``in_proj``'s rows it multiplies itself (cross-attention's queries, and the memory's keys
  and values) are multiplied as ``in_proj`` multiplies once it is a ``OneDNNLinear``
  (``OneDNNLinear.forward_rows``: oneDNN, and in inference its packed copies, bf16 or int8 where the
  model's maps are);
- dropout on the attention weights draws its mask more cheaply (:func:`attnkit.cpu.dropout.dropout`);
- inside a :class:`attnkit.cpu.packing.PackedEncoder`, its input and output are the real tokens' rows
  ``(rows, d_model)``: the Q/K/V projection runs on the rows, which are then laid out as ``(B, T, ·)``
  for the attention between positions, and the merged heads are packed again before ``W^O``;
- in training under bf16 autocast, the attention between positions (eq. 1) runs in float32 where it
  takes torch's fused kernel (``attention.functional.fused``): that kernel's CPU backward is several
  times slower in bf16 than in float32 (bench/train_speed.py ``--precision bf16``; docs/benchmarks.md),
  and its products are a small share of a step next to the projections, which stay bf16. The reference
  path (dropout on the weights) keeps bf16, whose batched products are the faster there;
- in inference, each row's attention is what it would be alone, whatever its batchmates and their
  lengths (:func:`attnkit.cpu.alone.attend_as_alone`; docs/invariance.md), where the keys' layout
  allows it (padding after the real keys, or none);
- traced into a compiled decoding step (:func:`decoding_step`), attention is written as products and
  sums (:func:`attend_as_sums`) rather than the fused kernel's call, so that the compiler fuses it
  with the reading of the keys and values: the step's self-attention gathers each row's past keys
  through an index of slots (``attnkit.cpu.compiled.trace``) and reads them once, where the fused
  kernel would take them copied into one tensor first. That copy of every row's keys at every step,
  and the kernel's cost per row and head for one query, were half of a beam-5 step's time. The
  compiler's sums over keys, padded to whole vectors, also run in the same order at any wider width (the
  fused kernel's blocks follow the width), so that the compiled encoder gives a source the same bits
  beside sources of any width (docs/invariance.md).

:func:`attnkit.cpu.speed_up` makes a model's ``MultiHeadAttention`` modules this class.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.attention.functional import fused
from attnkit.attention.invariance import queries_alone
from attnkit.attention.multihead import KVCache, MultiHeadAttention
from attnkit.cpu.alone import MEMORY, PADDED, PAST, attend_as_alone, attend_prompts_as_alone
from attnkit.cpu.dropout import dropout
from attnkit.cpu.linear import OneDNNLinear, linear
from attnkit.cpu.packing import active_packing


class CPUMultiHeadAttention(MultiHeadAttention):
    """``MultiHeadAttention`` with oneDNN's products, the cheaper dropout and packed rows (see above)."""

    drop_weights = staticmethod(dropout)

    def project_rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        if isinstance(self.in_proj, OneDNNLinear):
            return self.in_proj.forward_rows(x, start, stop)
        W, b = self.in_proj.weight, self.in_proj.bias  # (no oneDNN in this torch: see cpu/linear.py)
        return linear(x, W[start:stop], None if b is None else b[start:stop])

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
        """As ``MultiHeadAttention.forward``; what :meth:`_attend` needs to know of the call (what the keys
        are: attnkit.cpu.alone) is held for it in a ``ContextVar``, as decoding streams may run the same
        module in several threads at once."""
        token = _KEYS.set(MEMORY if memory is not None else PADDED if cache is None else PAST)
        try:
            return super().forward(query, memory, mask, cache=cache, need_weights=need_weights, causal=causal)
        finally:
            _KEYS.reset(token)

    def _project(self, query: Tensor, memory: Tensor | None, cache: KVCache | None) -> tuple[Tensor, ...]:
        packing = active_packing()
        if packing is None or memory is not None:
            return super()._project(query, memory, cache)
        qkv = packing.unpack(self.in_proj(query))  # (rows, 3·d_model) -> (B, T, 3·d_model)
        q, k, v = (self._split_heads(part) for part in qkv.chunk(3, dim=-1))  # (B, h, T, d_k) each
        if cache is not None:
            k, v = cache.append(k, v)
        return q, k, v

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        need_weights: bool = False,
        causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        dropout = self.dropout if self.training else 0.0
        settings = {"score": self.score, "normaliser": self.normaliser, "dropout_p": dropout}
        if _IN_DECODING_STEP.get() and not causal and fused(q, **settings, need_weights=need_weights):
            scale = 1.0 / math.sqrt(q.size(-1)) if self.score == "scaled_dot" else 1.0
            return attend_as_sums(q, k, v, mask, scale), None
        if causal and q.size(-2) == 1 and mask is None:  # the last position sees every key: no mask
            causal = False
        if q.size(-2) > 1 and queries_alone() and _KEYS.get() != PADDED and _inferring(q) and not causal:
            return self._each_query_alone(q, k, v, mask), None
        if _inferring(q) and not causal and fused(q, **settings, need_weights=need_weights):
            scale = None if self.score == "scaled_dot" else 1.0
            out = attend_as_alone(q, k, v, mask, scale, _KEYS.get())
            if out is None and mask is not None and _KEYS.get() == PAST:  # prompts padded on the left?
                out = attend_prompts_as_alone(q, k, v, mask, scale)
            if out is not None:
                return out, None
        if not (_trained_in_bf16(q) and fused(q, **settings, need_weights=need_weights)):
            return super()._attend(q, k, v, mask, need_weights, causal)
        with torch.autocast("cpu", enabled=False):  # else autocast would cast them back to bf16
            return super()._attend(q.float(), k.float(), v.float(), mask, need_weights, causal)

    def _each_query_alone(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Each of a row's ``T_q`` new queries attended as a step of that one query attends it
        (``attention.invariance.each_query_alone``: speculative decoding's check of a draft). Over a
        memory, each query becomes a row of its own beside its row's keys (one call: a step's products
        sum each row alike however many rows they take, where several queries in one row would be
        summed otherwise); over a decoder's past, one call per query, over the keys up to its position
        laid out as that step holds them (one contiguous tensor; no mask where the step has none). ``q
        (B, h, T_q, d_k)``, ``k`` and ``v (B, h, T_k, d_k)``, the new queries the last ``T_q`` positions
        of a past; ``mask`` ``(B or 1, 1, T_q or 1, T_k)``. Returns ``(B, h, T_q, d_k)``."""
        B, h, T_q, d_k = q.shape
        T_k = k.size(-2)
        if _KEYS.get() == MEMORY:
            rows = q.transpose(1, 2).reshape(B * T_q, h, 1, d_k)  # query j of row b: row b·T_q + j
            k, v = k.repeat_interleave(T_q, 0), v.repeat_interleave(T_q, 0)  # (B·T_q, h, T_k, d_k)
            if mask is not None:  # each query's own: (B·T_q, 1, 1, T_k)
                mask = mask.expand(B, 1, T_q, T_k).transpose(1, 2).reshape(B * T_q, 1, 1, T_k)
            out, _ = self._attend(rows, k, v, mask)  # (B·T_q, h, 1, d_k)
            return out.view(B, T_q, h, d_k).transpose(1, 2)
        out = []
        for j in range(T_q):
            seen = T_k - T_q + j + 1  # the keys up to query j's position
            k_j, v_j, mask_j = k[..., :seen, :].contiguous(), v[..., :seen, :].contiguous(), None
            if mask is not None:
                mask_j = mask[..., j : j + 1, :seen] if mask.size(-2) > 1 else mask[..., :seen]
                mask_j = None if bool(mask_j.all()) else mask_j
            out.append(self._attend(q[..., j : j + 1, :], k_j, v_j, mask_j)[0])  # (B, h, 1, d_k)
        return torch.cat(out, dim=-2)

    def _merge_heads(self, out: Tensor) -> Tensor:
        packing = active_packing()
        if packing is None:
            return super()._merge_heads(out)
        B, _, T_q, _ = out.shape
        merged = out.transpose(1, 2).reshape(B, T_q, self.d_model)  # (B, h, T, d_k) -> (B, T, d_model)
        return self.out_proj(packing.pack(merged))  # (rows, d_model)


_IN_DECODING_STEP: ContextVar[bool] = ContextVar("in_decoding_step", default=False)
# the lanes of the compiler's vectorised sums over keys (AVX-512's floats; two vectors of AVX2's), to a
# multiple of which attend_as_sums pads the keys
KEY_LANES = 16
# what the keys of the attention running in this thread or task are (attnkit.cpu.alone): the padded
# positions of its queries, a memory, or a decoder's past
_KEYS: ContextVar[str] = ContextVar("attention_keys", default=MEMORY)


def _inferring(q: Tensor) -> bool:
    """Whether these queries are inference's on a CPU in float32, outside a compiler's trace: where each
    row's attention must be what it is alone (docs/invariance.md)."""
    return (
        q.is_cpu
        and q.dtype == torch.float32
        and not (torch.is_grad_enabled() and q.requires_grad)
        and not torch.compiler.is_compiling()
    )


@contextmanager
def decoding_step() -> Iterator[None]:
    """While a decoding step is traced for compiling (the first, with the encoder, or one new token per
    row), attention of softmaxed (scaled) dot products takes :func:`attend_as_sums` (see the module
    docstring)."""
    token = _IN_DECODING_STEP.set(True)
    try:
        yield
    finally:
        _IN_DECODING_STEP.reset(token)


def attend_as_sums(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """``softmax(scale · q kᵀ, masked) v`` (eq. 1) as elementwise products and sums, which a compiler
    fuses with whatever produced ``k`` and ``v`` (a gather, a concatenation, a dtype's widening) instead
    of materialising them. For a few queries, whose products are too small for a matrix kernel, the
    faster too; for an encoder's queries of short sources (tens of tokens), a few percent slower.

    The compiler sums a row's weights over the keys in vectors of :data:`KEY_LANES` lanes and the
    last few in a tail loop, so the softmax's sum and the weighted values are padded (zeros) to a
    multiple of that many keys: with every key in whole vectors a row's sums run in the same order at
    any wider width (a padded or masked key adds exact zeros in its lanes), and a source gets the same
    bits beside sources of any width (docs/invariance.md). The scores are computed for the real keys
    alone (the padded ones' products were 2-3% of a beam-5 step's time); the maximum needs no padding,
    as it is the same in any order. Only the keys are padded: the queries, and everything else a
    source's positions go through, stay at the batch's own width. ``q (..., T_q, d_k)``, ``k (...,
    T_k, d_k)``, ``v (..., T_k, d_v)``, ``mask`` boolean, broadcastable to ``(..., T_q, T_k)``, True =
    may attend; every query must see some key."""
    keys = k.size(-2)
    extra = (-keys) % KEY_LANES  # (a symbol in a trace: the compiled step serves every width)
    scores = (q.unsqueeze(-2) * k.unsqueeze(-3).to(q.dtype)).sum(-1) * scale  # (..., T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    exps = F.pad((scores - scores.amax(-1, keepdim=True)).exp(), (0, extra))  # (..., T_q, T_k + extra)
    weights, v = exps / exps.sum(-1, keepdim=True), F.pad(v, (0, 0, 0, extra))  # v: (..., T_k + extra, d_v)
    return (weights.unsqueeze(-1) * v.unsqueeze(-3).to(q.dtype)).sum(-2)  # (..., T_q, d_v)


def _trained_in_bf16(q: Tensor) -> bool:
    """Whether these queries are a training step's under the CPU's bf16 autocast (see the docstring)."""
    return q.is_cpu and q.dtype == torch.bfloat16 and q.requires_grad and torch.is_autocast_enabled("cpu")


def as_cpu_attention(model: nn.Module) -> int:
    """Make every plain ``MultiHeadAttention`` of ``model`` a :class:`CPUMultiHeadAttention`, in place;
    returns how many."""
    modules = [module for module in model.modules() if type(module) is MultiHeadAttention]
    for module in modules:
        module.__class__ = CPUMultiHeadAttention
    return len(modules)
