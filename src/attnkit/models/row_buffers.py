"""Buffers with room for the per-source tensors of a running batch (continuous batching,
decode/continuous.py): memories, source ids and masks, the cross-attention's keys and values.

Sources join a running batch at any step and leave it when done. Concatenating the running sources'
tensors with the newcomers' at every join copies every running source for the sake of a few new ones
(about 2 ms a join for 32 sources of the README's Multi30k model, a tenth of a running batch's
time on one thread). Here each tensor is the leading rows of a buffer with spare rows behind them: a
join writes only the newcomers' rows behind the running ones (:meth:`RowBuffers.joined`); when sources
leave, the last ones move into their places and only those are copied (:meth:`RowBuffers.kept`; rows
kept in another order are gathered into the other buffer of a pair: one copy, as ``index_select``
makes). The leading rows of a contiguous buffer are contiguous, so a step reads them as it reads any
tensor; the rows behind them are never read.
"""

from __future__ import annotations

import torch
from torch import Tensor

# rows a buffer holds at least (it holds twice the rows it was made for, so that sources can join)
LEAST_ROWS = 16


class RowBuffers:
    """Each named tensor's pair of buffers (``(capacity, ...)``, the tensor the leading rows of one of
    them): see the module docstring."""

    def __init__(self) -> None:
        self.pairs: dict[str, list[Tensor]] = {}
        # the last index kept by, and its moves: the places written and the rows read into them
        self.moves: tuple[Tensor, tuple[Tensor, Tensor] | None] | None = None

    def joined(self, name: str, mine: Tensor, theirs: Tensor, dim: int, fill: float) -> Tensor:
        """The rows of ``mine`` then those of ``theirs``, the narrower padded with ``fill`` after its
        entries along ``dim`` to the wider's size (``models.decoding.stacked``'s rows), written
        behind ``mine`` in its buffer where it has room (else in a new buffer, ``mine`` copied first)."""
        N, M = mine.size(0), theirs.size(0)
        width = max(mine.size(dim), theirs.size(dim))
        buffer = held = self._holding(name, mine)
        if buffer is None or buffer.size(0) < N + M or mine.size(dim) < width:
            shape = list(mine.shape)
            shape[0], shape[dim] = max(2 * (N + M), LEAST_ROWS), width
            buffer = self._replace(name, held, mine.new_empty(shape))
            _write(buffer, 0, mine, dim, fill)
        _write(buffer, N, theirs, dim, fill)
        return buffer[: N + M]

    def kept(self, name: str, tensor: Tensor, index: Tensor) -> Tensor:
        """``tensor.index_select(0, index)``. Where every row that moves comes from past the rows kept
        (those that stay keep their places, the last ones fill the places left: ``search.staying``), only
        the moved rows are copied, in place; else the rows are gathered into the buffer of the pair that
        does not hold ``tensor`` (a new one where it is too small), with room behind them."""
        K = index.size(0)
        held = self._holding(name, tensor)
        if held is not None and (moves := self._moves(index)) is not None:
            places, rows = moves
            held.index_copy_(0, places, tensor.index_select(0, rows))
            return held[:K]
        free = [b for b in self.pairs.get(name, []) if b is not held and b.shape[1:] == tensor.shape[1:]]
        if free and free[0].size(0) >= K:
            buffer = free[0]
        else:
            shape = (max(2 * K, LEAST_ROWS), *tensor.shape[1:])
            buffer = self._replace(name, held, tensor.new_empty(shape))
        torch.index_select(tensor, 0, index, out=buffer[:K])
        return buffer[:K]

    def _moves(self, index: Tensor) -> tuple[Tensor, Tensor] | None:
        """The places ``i`` where ``index[i] != i`` and the rows they take, ``index[i]``, if each is a
        row past the rows kept (so that no row is read after it is written), else None; worked out once
        per index (a decoding keeps a dozen tensors by one)."""
        if self.moves is None or self.moves[0] is not index:
            K = index.size(0)
            places = (index != torch.arange(K, device=index.device)).nonzero().squeeze(1)  # (m,)
            rows = index[places]
            self.moves = (index, (places, rows) if not len(rows) or int(rows.min()) >= K else None)
        return self.moves[1]

    def _holding(self, name: str, tensor: Tensor) -> Tensor | None:
        """The buffer of ``name`` whose leading rows ``tensor`` is, if any."""
        for buffer in self.pairs.get(name, []):
            if (
                tensor.data_ptr() == buffer.data_ptr()
                and tensor.shape[1:] == buffer.shape[1:]
                and tensor.is_contiguous()
            ):
                return buffer
        return None

    def _replace(self, name: str, held: Tensor | None, new: Tensor) -> Tensor:
        """Put ``new`` in the pair of ``name`` in place of the buffer other than ``held`` (the one
        holding the tensor being read, kept; None: either)."""
        pair = self.pairs.get(name, [])
        self.pairs[name] = [b for b in pair if b is held] + [new]
        return new


def _write(buffer: Tensor, at: int, rows: Tensor, dim: int, fill: float) -> None:
    """``rows`` into ``buffer[at : at + len(rows)]``, padded with ``fill`` along ``dim``."""
    target = buffer[at : at + rows.size(0)]
    width = rows.size(dim)
    target.narrow(dim, 0, width).copy_(rows)
    if width < buffer.size(dim):
        target.narrow(dim, width, buffer.size(dim) - width).fill_(fill)
