"""Multi-head attention with the CPU's faster pieces, the same arithmetic as the paper's module.

:class:`CPUMultiHeadAttention` is :class:`attnkit.attention.MultiHeadAttention` (same parameters, same
state-dict keys) with four changes, each where it pays on a CPU and a no-op elsewhere:

- the slices of ``in_proj`` it multiplies itself (cross-attention's queries, and the memory's keys and
  values) go through oneDNN (:func:`attnkit.cpu.linear.linear`), as its ``in_proj`` and ``out_proj``
  layers do once they are ``OneDNNLinear``;
- dropout on the attention weights draws its mask more cheaply (:func:`attnkit.cpu.dropout.dropout`);
- inside a :class:`attnkit.cpu.packing.PackedEncoder`, its input and output are the real tokens' rows
  ``(rows, d_model)``: the Q/K/V projection runs on the rows, which are then laid out as ``(B, T, ·)``
  for the attention between positions, and the merged heads are packed again before ``W^O``;
- in training under bf16 autocast, the attention between positions (eq. 1) runs in float32 where it
  takes torch's fused kernel (``attention.functional.fused``): that kernel's CPU backward is several
  times slower in bf16 than in float32 (bench/train_speed.py ``--precision bf16``; docs/benchmarks.md),
  and its products are a small share of a step next to the projections, which stay bf16. The reference
  path (dropout on the weights) keeps bf16, whose batched products are the faster there.

:func:`attnkit.cpu.speed_up` makes a model's ``MultiHeadAttention`` modules this class.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.attention.functional import fused
from attnkit.attention.multihead import KVCache, MultiHeadAttention
from attnkit.cpu.dropout import dropout
from attnkit.cpu.linear import linear
from attnkit.cpu.packing import active_packing


class CPUMultiHeadAttention(MultiHeadAttention):
    """``MultiHeadAttention`` with oneDNN's products, the cheaper dropout and packed rows (see above)."""

    project = staticmethod(linear)
    drop_weights = staticmethod(dropout)

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
        if not (_trained_in_bf16(q) and fused(q, **settings, need_weights=need_weights)):
            return super()._attend(q, k, v, mask, need_weights, causal)
        with torch.autocast("cpu", enabled=False):  # else autocast would cast them back to bf16
            return super()._attend(q.float(), k.float(), v.float(), mask, need_weights, causal)

    def _merge_heads(self, out: Tensor) -> Tensor:
        packing = active_packing()
        if packing is None:
            return super()._merge_heads(out)
        B, _, T_q, _ = out.shape
        merged = out.transpose(1, 2).reshape(B, T_q, self.d_model)  # (B, h, T, d_k) -> (B, T, d_model)
        return self.out_proj(packing.pack(merged))  # (rows, d_model)


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
