"""Input embeddings (Vaswani et al., 2017, §3.4) and positional encodings (§3.5).

The token embedding is multiplied by √d_model. Why: with weights shared with the output projection and
initialised with standard deviation d_model^-0.5, the scaled embedding has entries of size ~1, the same
scale as the positional encoding added to it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class Embeddings(nn.Module):
    """Token ids ``(B, T)`` to vectors ``(B, T, d_model)``, scaled by √d_model as in the paper.

    ``scale=False`` leaves them unscaled, as GPT and BERT do (their embeddings are initialised with a
    standard deviation of 0.02, the size of their learned positions, instead).
    """

    def __init__(
        self, vocab_size: int, d_model: int, padding_idx: int | None = None, scale: bool = True
    ) -> None:
        super().__init__()
        self.lut = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        self.d_model, self.scale = d_model, scale
        nn.init.normal_(self.lut.weight, mean=0.0, std=d_model**-0.5 if scale else 0.02)
        if padding_idx is not None:
            nn.init.zeros_(self.lut.weight[padding_idx])

    def forward(self, ids: Tensor) -> Tensor:
        vectors = self.lut(ids)
        return vectors * math.sqrt(self.d_model) if self.scale else vectors


def sinusoid_table(n_positions: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """``PE(pos, 2i) = sin(pos / 10000^(2i/d_model))``, ``PE(pos, 2i+1) = cos(...)``; ``(P, d_model)``.

    ``layout="interleaved"`` is the paper's formula (sin at even, cos at odd dimensions);
    ``"concatenated"`` puts all sines first and all cosines after, as fairseq, tensor2tensor and Marian
    checkpoints do. Computed in float64 so that long positions stay accurate in float32.
    """
    if layout not in ("interleaved", "concatenated"):
        raise ValueError(f"layout must be 'interleaved' or 'concatenated', got {layout!r}")
    position = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    inv_freq = torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (ceil(d/2),)
    angle = position * inv_freq  # (P, ceil(d/2))
    sin, cos = torch.sin(angle), torch.cos(angle)[:, : d_model // 2]
    if layout == "concatenated":
        return torch.cat([sin, cos], dim=1).float()
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = sin, cos
    return table.float()


class PositionalEncoding(nn.Module):
    """Adds fixed sinusoidal position vectors, then dropout (the paper's P_drop on the embedding sums).

    The table grows on demand, so any length works; it is not saved in checkpoints.
    """

    def __init__(
        self, d_model: int, dropout: float = 0.0, max_len: int = 1024, layout: str = "interleaved"
    ) -> None:
        super().__init__()
        self.d_model, self.layout = d_model, layout
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoid_table(max_len, d_model, layout), persistent=False)

    def forward(self, x: Tensor, start: int = 0, positions: Tensor | None = None) -> Tensor:
        """``x (B, T, d_model)`` holding positions ``start .. start+T-1``, or ``positions (B, T)``
        (where a compiler traces them, within the table: it bounds the positions it traces)."""
        end = start + x.size(1) if positions is None else _last(positions) + 1
        if end > self.pe.size(0):
            self.pe = sinusoid_table(max(end, 2 * self.pe.size(0)), self.d_model, self.layout).to(
                self.pe.device
            )
        table = self.pe[start:end] if positions is None else self.pe[positions]  # (T or B×T, d_model)
        return self.dropout(x + table.to(x.dtype))


def _last(positions: Tensor) -> int:
    """The last of ``positions``; -1 where a compiler traces them (their values are unknown then)."""
    return -1 if torch.compiler.is_compiling() else int(positions.max())


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned vector per position (the §3.5 alternative, used by BERT and GPT), then dropout."""

    def __init__(self, d_model: int, dropout: float = 0.0, max_len: int = 1024) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, start: int = 0, positions: Tensor | None = None) -> Tensor:
        """``x (B, T, d_model)`` holding positions ``start .. start+T-1``, or ``positions (B, T)``
        (where a compiler traces them, within the table)."""
        end = start + x.size(1) if positions is None else _last(positions) + 1
        if end > self.weight.size(0):
            raise ValueError(
                f"sequence reaches position {end} but learned positions stop at {self.weight.size(0)}"
            )
        return self.dropout(x + (self.weight[start:end] if positions is None else self.weight[positions]))


class EmbeddingNorm(nn.Module):
    """LayerNorm, then dropout, of the token + position sum: BERT's embedding (Devlin et al., 2019), for
    an encoder-decoder warm-started from a BERT-style encoder."""

    def __init__(self, d_model: int, dropout: float, eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.norm(x))


def positional_encoding(
    kind: str, d_model: int, dropout: float, max_len: int, layout: str = "interleaved"
) -> PositionalEncoding | LearnedPositionalEmbedding:
    """The positional module for ``kind`` ``"sinusoidal"`` or ``"learned"``."""
    if kind == "sinusoidal":
        return PositionalEncoding(d_model, dropout, max_len, layout)
    if kind == "learned":
        return LearnedPositionalEmbedding(d_model, dropout, max_len)
    raise ValueError(f"positions must be 'sinusoidal' or 'learned', got {kind!r}")
