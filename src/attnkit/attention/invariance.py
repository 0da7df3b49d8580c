"""What keeps each row's output in inference what it is when the row is alone, whatever its batchmates
(docs/invariance.md): rows grouped by how many keys they attend to, and kernels run one row at a time.

A sum over a row's keys (a softmax's denominator, a context's weighted sum of values) is added up in an
order that depends on how many keys the kernel is given: vector lanes, blocks and their tails all
follow that length, padded keys included (their weight is exactly zero, but they move where the real
ones fall). A batch pads every row to its longest, so the same row would be summed in another order
in another batch. Inference therefore gives each row its real keys padded to the next multiple of
:data:`KEY_BUCKET` (a length fixed by the row alone) and attends for each group of rows of one such
length together (:func:`groups`). The Transformer's attention does it in ``attnkit.cpu.alone``; the
RNN decoders' attention in ``attnkit.models.rnn_attention``.

A convolution's kernel blocks a batch by its size (oneDNN's on a CPU), so an image's features, or the
location features of an utterance's attention, would depend on the batch: in inference an image's
convolutions run one image at a time (:func:`each_alone`), a small cost next to the decoding that
follows, and the location features, taken at every step, as products summed over each window
(:func:`correlated`).

An elementwise function of a vectorised CPU kernel (``exp``, ``log``, ``sigmoid``) takes its entries
in vectors and the last few, after the last whole vector, one at a time in scalar code, which may round
otherwise (on AVX2: a sigmoid's result differed by one unit in the last place): whether a row's
entries take one path or the other depends on where the row falls in its batch. Where a model applies
one to rows of a width that is not a multiple of the vectors' (a pointer-generator's switch, one entry
a row; its mixed probabilities over a vocabulary of any size), :func:`elementwise_alike` pads each row
so that every entry takes the vector path.

A step that decodes several new positions of each row at once (speculative decoding's check of a
draft, decode/speculative.py) must give each position the bits a step of one new token would: under
:func:`each_query_alone`, attention attends each of those queries as that step would, to the keys
up to its own position, one call each (``attnkit.cpu.attention``), while the linear maps, whose rows
are summed alike in any number, take all the positions at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

KEY_BUCKET = 8  # keys padded on the right are padded to a multiple of this many
# entries a vectorised elementwise CPU loop takes at a time (two vectors), at most: 64 bytes of float32
# a vector on AVX-512, twice that for 16-bit floats (see elementwise_alike)
VECTOR_STEP = 64
# entries torch's elementwise kernels take in one thread (at::internal::GRAIN_SIZE): a piece of at most
# this many is one loop from its first entry, whose vectors start where the piece does
ONE_THREAD = 32768
# whether the attention running in this thread or task attends its queries one at a time (see the
# module docstring; a ContextVar: decoding streams run the same modules in several threads at once)
_EACH_QUERY_ALONE: ContextVar[bool] = ContextVar("each_query_alone", default=False)


@contextmanager
def each_query_alone() -> Iterator[None]:
    """While held, inference's attention attends each of a row's new queries as a step of that one
    query would (see the module docstring)."""
    token = _EACH_QUERY_ALONE.set(True)
    try:
        yield
    finally:
        _EACH_QUERY_ALONE.reset(token)


def queries_alone() -> bool:
    """Whether :func:`each_query_alone` is held here."""
    return _EACH_QUERY_ALONE.get()


def bucketed(lengths: Tensor) -> Tensor:
    """Each row's number of real keys ``(B,)`` rounded up to a multiple of :data:`KEY_BUCKET` (at least
    one bucket: a row with no real key still gets a length)."""
    return (lengths.clamp(min=1) + KEY_BUCKET - 1) // KEY_BUCKET * KEY_BUCKET


def key_groups(mask: Tensor) -> Iterator[tuple[int, Tensor | slice]]:
    """:func:`groups` of the rows of a padding ``mask (B, 1, S)`` (True at a row's real keys, which come
    first) by their number of real keys rounded up with :func:`bucketed`."""
    return groups(bucketed(mask.sum(-1).view(-1)))


def groups(lengths: Tensor) -> Iterator[tuple[int, Tensor | slice]]:
    """``(length, rows)`` for each length in ``lengths (B,)``: the rows as a slice where each length's
    rows are consecutive (the batches ``translate`` sorts by length, a running batch's rows by the step
    they joined at: slices, not copies), else as an index."""
    values, counts = torch.unique_consecutive(lengths, return_counts=True)
    if len(values) == len(set(values.tolist())):  # each length in one run of rows
        start = 0
        for value, count in zip(values.tolist(), counts.tolist(), strict=True):
            yield value, slice(start, start + count)
            start += count
        return
    for value in torch.unique(lengths).tolist():
        yield value, (lengths == value).nonzero().squeeze(1)


def cut_or_padded(x: Tensor, length: int, dim: int) -> Tensor:
    """``x`` cut, or padded with zeros (False for a mask), to ``length`` positions along ``dim``."""
    if x.size(dim) >= length:
        return x.narrow(dim, 0, length)
    shape = list(x.shape)
    shape[dim] = length - x.size(dim)
    return torch.cat([x, x.new_zeros(shape)], dim)


def each_alone(kernel: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``kernel(x)`` for a batch ``x (B, ...)``; when no gradient is wanted (inference), computed one row
    at a time, so that a row's output is the bits it gets alone (see the module docstring)."""
    if torch.is_grad_enabled():
        return kernel(x)
    return torch.cat([kernel(row) for row in x.split(1)])


def correlated(x: Tensor, filters: Tensor) -> Tensor:
    """``conv1d(x[:, None], filters, padding=w // 2)`` as PyTorch computes it (a correlation), for rows
    ``x (B, S)`` and ``filters (C, 1, w)`` (``w`` odd), transposed: ``(B, S, C)``; each output one sum of
    ``w`` products in a fixed order, whatever the batch (a convolution's kernel blocks a batch by its
    size). For a few filters over a short row, cheaper than a kernel call per row (:func:`each_alone`)."""
    w = filters.size(-1)
    windows = torch.nn.functional.pad(x, (w // 2, w // 2)).unfold(-1, w, 1)  # (B, S, w)
    return (windows.unsqueeze(-2) * filters.squeeze(1)).sum(-1)  # (B, S, 1, w) · (C, w) -> (B, S, C)


def elementwise_alike(function: Callable[[Tensor], Tensor], x: Tensor, fill: float = 1.0) -> Tensor:
    """``function(x)`` for an elementwise ``function`` whose CPU kernel rounds its vectors' entries and
    the scalar tail's otherwise (see the module docstring), the same bits for a row of ``x`` (along its
    last dimension) wherever the row falls in its batch: in inference on a CPU, each row is padded with
    ``fill`` (in the function's domain) to a multiple of :data:`VECTOR_STEP` entries and the rows are
    taken in pieces of at most :data:`ONE_THREAD` entries, so that every entry takes the vector path.
    Elsewhere (off a CPU, or with gradients: training) it is ``function(x)``."""
    if not x.is_cpu or torch.is_grad_enabled() or x.numel() == 0:
        return function(x)
    width = x.size(-1)
    padded = -(-width // VECTOR_STEP) * VECTOR_STEP
    rows = torch.nn.functional.pad(x.reshape(-1, width), (0, padded - width), value=fill)  # (R, padded)
    out = torch.empty(rows.size(0), width, dtype=x.dtype)
    step = max(1, ONE_THREAD // padded)  # rows in one piece
    for start in range(0, rows.size(0), step):
        out[start : start + step] = function(rows[start : start + step])[:, :width]
    return out.view(x.shape)
