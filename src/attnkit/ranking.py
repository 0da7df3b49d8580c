"""Ranking with a fixed rule for ties: the ``k`` largest entries of each row, of equal entries the one
of lowest index first (:func:`first_k`), and the same faster for rows of thousands (:func:`top_k`).

Every search ranks by these (beam search's continuations and finished hypotheses, the CPU's block
rankings in ``attnkit.cpu.search``), so that a sentence's answer does not depend on the order in which
a kernel meets equal scores, which may differ for a row alone and in a batch (docs/invariance.md).
"""

from __future__ import annotations

import torch
from torch import Tensor


def first_k(x: Tensor, k: int, index: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The ``k`` largest entries of each row of ``x (N, C)``, largest first, and where they are (their
    ``index``, default their column): of equal entries, the one of lowest index first, as ``argmax``
    takes the first of equals. ``torch.topk`` orders equals as it meets them, which need not be the
    same for a row alone and in a batch, nor for greedy search and a beam of one: a fixed rule keeps a
    sentence's answer its own (docs/invariance.md). ``torch.topk`` finds them (a full sort costs ten
    times more), and one more, the first left out: where no two of them are equal (the common case),
    the first ``k`` are the answer, in the one order there is; else the kept ones are ordered by value,
    then index, and rows where an entry left out equals the last one kept are ranked whole."""
    if index is None:
        index = torch.arange(x.size(-1), device=x.device).expand_as(x)
    reach = min(k + 1, x.size(-1))  # the k kept and the first left out, if any
    values, at = x.topk(reach, dim=-1)  # (N, reach) each, largest first, equals in any order
    equals_in_reach = bool((values[:, 1:] == values[:, :-1]).any())
    values, chosen = values[:, :k], index.gather(1, at[:, :k])  # (N, k) each
    if not equals_in_reach:
        return values, chosen  # one order only (the common case)
    tied = (x >= values[:, -1:]).sum(-1) > k  # (N,): an equal of the last one kept was left out
    # the kept ones by value, then index: a stable sort by value of them in index order
    by_index = chosen.argsort(dim=-1)
    values, chosen = values.gather(1, by_index), chosen.gather(1, by_index)
    values, order = values.sort(dim=-1, descending=True, stable=True)
    chosen = chosen.gather(1, order)
    if bool(tied.any()):  # those rows ranked whole, in index order
        rows = tied.nonzero().squeeze(1)
        by_index = index[rows].argsort(dim=-1)
        ranked, at = x[rows].gather(1, by_index).sort(dim=-1, descending=True, stable=True)
        values[rows], chosen[rows] = ranked[:, :k], index[rows].gather(1, by_index).gather(1, at[:, :k])
    return values, chosen


def top_k(x: Tensor, k: int, block: int = 64) -> tuple[Tensor, Tensor]:
    """:func:`first_k` of a wide ``x (N, V)``, faster: a row's k largest entries lie in the k blocks
    (of ``block`` consecutive entries) with the largest maxima, since a block outside them has k
    blocks above it, each holding a larger entry (of equal maxima, the first blocks). So: block maxima
    (one fast read), their top k, and the top k of those k blocks' entries, taken in column order.
    Ranking every row whole is 3-4x slower for 160 rows of 8,000."""
    V = x.size(-1)
    blocks = V // block
    if k * block * 4 > V:
        return first_k(x, k)
    tiled = x[:, : blocks * block].unflatten(-1, (blocks, block))  # (N, blocks, block), a view
    best_blocks = first_k(tiled.amax(-1), k)[1].sort(dim=-1).values  # (N, k), in column order
    inside = tiled.gather(1, best_blocks[..., None].expand(-1, -1, block)).flatten(1)  # (N, k·block)
    candidates = torch.cat([inside, x[:, blocks * block :]], dim=1)  # and the last, partial block
    values, at = first_k(candidates, k)  # (N, k) each
    in_block = best_blocks.gather(1, (at // block).clamp(max=k - 1)) * block + at % block
    return values, torch.where(at < k * block, in_block, blocks * block + at - k * block)
