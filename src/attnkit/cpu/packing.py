"""The real tokens of a padded batch as rows of one matrix, so that position-wise work skips padding.

A batch of sentences of 10 to 18 tokens, padded to 18, is about a fifth padding. Everything in an
encoder layer but the attention itself treats each position alone (the Q/K/V and output projections,
residuals, LayerNorms, the feed-forward network), so it can run on the real tokens only, packed as
``(N, d_model)`` rows, as torch's nested-tensor encoder and FlashAttention's "varlen" interface do;
only the attention between positions needs the ``(B, T, ...)`` layout back, and pads there with zeros
that the key padding mask hides.

The packed matrix has a few more rows than real tokens (copies of the first token, at most 3%):
:func:`attnkit.cpu.linear.padded_rows` many, a row count the oneDNN linear maps multiply without
copying the rows into a larger matrix first. The extra rows are never unpacked, so they receive no
gradient and change no output.

:class:`PackedEncoder` is the paper's encoder stack doing so; :func:`attnkit.cpu.speed_up` makes a
model's ``Encoder`` one. Its layers run unchanged on the rows (a sub-layer's residual, dropout and
LayerNorm, and the feed-forward network, read each row alone); only their self-attention
(:class:`attnkit.cpu.attention.CPUMultiHeadAttention`) asks :func:`active_packing` and moves between
rows and the padded layout around the attention itself. The packing is held in a ``ContextVar``, so
that encoders running at once in several threads (decoding streams) each see their own.
"""

from __future__ import annotations

from contextvars import ContextVar

import torch
from torch import Tensor

from attnkit.cpu.linear import padded_rows
from attnkit.nn.transformer import Encoder


class Packing:
    """Where the real tokens of a ``(B, T)`` batch are; :meth:`pack` and :meth:`unpack` move between
    ``(B, T, C)`` tensors and ``(rows, C)`` matrices of its real tokens (in batch-major order)."""

    def __init__(self, valid: Tensor) -> None:
        """``valid (B, T)``: True at real tokens. At least one must be real."""
        self.batch, self.length = valid.shape
        real = valid.flatten().nonzero().squeeze(1)  # (N,) indices into the flattened (B·T) positions
        self.n = len(real)
        if self.n == 0:
            raise ValueError("cannot pack a batch without real tokens")
        self.index = real  # (N,)
        self.padding = (~valid).flatten().nonzero().squeeze(1)  # (B·T - N,)
        extra = padded_rows(self.n) - self.n
        self.rows_index = torch.cat([real, real[:1].expand(extra)]) if extra else real  # (rows,)

    def pack(self, x: Tensor) -> Tensor:
        """``(B, T, C) -> (rows, C)``: the real tokens' vectors (and the few copies)."""
        return x.flatten(0, 1).index_select(0, self.rows_index)

    def unpack(self, rows: Tensor) -> Tensor:
        """``(rows, C) -> (B, T, C)``: each real token's vector back in its place, zeros at padding."""
        out = rows.new_empty(self.batch * self.length, rows.size(-1))  # (B·T, C)
        out.index_fill_(0, self.padding, 0)  # only padding zeroed: the rest is written just below
        return out.index_copy_(0, self.index, rows[: self.n]).view(self.batch, self.length, -1)


_ACTIVE: ContextVar[Packing | None] = ContextVar("attnkit_packing", default=None)


def active_packing() -> Packing | None:
    """The packing of the encoder stack running in this thread or task, if it runs on packed rows."""
    return _ACTIVE.get()


class PackedEncoder(Encoder):
    """The encoder stack on the real tokens' rows only (same parameters and outputs at real positions;
    zeros at padded ones). Every layer's self-attention must be a ``CPUMultiHeadAttention``."""

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        caches: list | None = None,
        causal: bool = False,
        valid: Tensor | None = None,
    ) -> Tensor:
        """As ``Encoder.forward``; with ``valid (B, T)`` and padding in it (and no caches), on packed rows.
        Traced for a compiler, on the padded layout: the number of real tokens is data, which a trace
        cannot branch on."""
        if torch.compiler.is_compiling() or valid is None or caches is not None or bool(valid.all()):
            return super().forward(x, mask, caches, causal)
        packing = Packing(valid)
        token = _ACTIVE.set(packing)
        try:
            rows = super().forward(packing.pack(x), mask, None, causal)  # (rows, d_model)
        finally:
            _ACTIVE.reset(token)
        return packing.unpack(rows)  # (B, T, d_model)
