"""Multi-head attention with the CPU's faster pieces, the same arithmetic as the paper's module.

:class:`CPUMultiHeadAttention` is :class:`attnkit.attention.MultiHeadAttention` (same parameters, same
state-dict keys) with three changes, each where it pays on a CPU and a no-op elsewhere:

- the slices of ``in_proj`` it multiplies itself (cross-attention's queries, and the memory's keys and
  values) go through oneDNN (:func:`attnkit.cpu.linear.linear`), as its ``in_proj`` and ``out_proj``
  layers do once they are ``OneDNNLinear``;
- dropout on the attention weights draws its mask more cheaply (:func:`attnkit.cpu.dropout.dropout`);
- inside a :class:`attnkit.cpu.packing.PackedEncoder`, its input and output are the real tokens' rows
  ``(rows, d_model)``: the Q/K/V projection runs on the rows, which are then laid out as ``(B, T, ·)``
  for the attention between positions, and the merged heads are packed again before ``W^O``.

:func:`attnkit.cpu.speed_up` makes a model's ``MultiHeadAttention`` modules this class.
"""

from __future__ import annotations

from torch import Tensor, nn

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

    def _merge_heads(self, out: Tensor) -> Tensor:
        packing = active_packing()
        if packing is None:
            return super()._merge_heads(out)
        B, _, T_q, _ = out.shape
        merged = out.transpose(1, 2).reshape(B, T_q, self.d_model)  # (B, h, T, d_k) -> (B, T, d_model)
        return self.out_proj(packing.pack(merged))  # (rows, d_model)


def as_cpu_attention(model: nn.Module) -> int:
    """Make every plain ``MultiHeadAttention`` of ``model`` a :class:`CPUMultiHeadAttention`, in place;
    returns how many."""
    modules = [module for module in model.modules() if type(module) is MultiHeadAttention]
    for module in modules:
        module.__class__ = CPUMultiHeadAttention
    return len(modules)
