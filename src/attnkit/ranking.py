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
    ``index``, default their column; below 2^32): of equal entries, the one of lowest index first, as
    ``argmax`` takes the first of equals. ``torch.topk`` orders equals as it meets them, which need not
    be the same for a row alone and in a batch, nor for greedy search and a beam of one: a fixed rule
    keeps a sentence's answer its own (docs/invariance.md). Equal entries are common: a bf16 output
    layer's logits take few distinct values, and a batch's rows hold equals at most steps.

    So each entry is ranked by one integer that holds its value and its index (:func:`_ranking_keys`):
    no two are equal, so ``torch.topk`` has one answer, and finds it as fast as among the values
    (half the time of ranking the values and then ordering equals). Float64 entries, which do not fit
    beside an index, are ranked whole: by index, then stably by value (slower; references and tests)."""
    if index is None:
        index = torch.arange(x.size(-1), device=x.device).expand_as(x)
    if x.dtype in (torch.float32, torch.bfloat16, torch.float16):  # exactly float32 numbers
        at = _ranking_keys(x, index).topk(k, dim=-1, largest=False).indices  # (N, k)
        return x.gather(1, at), index.gather(1, at)
    by_index = index.argsort(dim=-1)
    ranked, at = x.gather(1, by_index).sort(dim=-1, descending=True, stable=True)
    return ranked[:, :k], index.gather(1, by_index).gather(1, at[:, :k])


def _ranking_keys(x: Tensor, index: Tensor) -> Tensor:
    """``(N, C)`` int64 keys, smallest first in the order :func:`first_k` ranks ``x``'s entries: by
    value, then by lowest ``index`` (in [0, 2^32)). A float32's bits read as a signed integer keep the
    order of positive numbers and reverse that of negative ones, so the negatives' bits other than the
    sign are flipped; ``+ 0.0`` makes -0.0 (which equals 0.0) 0.0. The key is ``index - 2^32 · that
    integer``: the value's integer in the upper 32 bits, negated so that one subtraction writes the
    key (a third fewer passes over the entries than shifting and subtracting). NaNs rank above
    infinity, or below minus infinity."""
    bits = (x.float() + 0.0).view(torch.int32)  # (N, C)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # the floats' order, as integers
    return torch.sub(index, ordered, alpha=1 << 32)  # (N, C) int64


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


def best_continuations_by_top_k(
    log_probs: Tensor, scores: Tensor, width: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The ``width`` best continuations of each source's K beams, ``(scores, beam, token)`` each ``(n,
    width)``, best first, from the next tokens' ``log_probs (n·K, V)`` and the beams' ``scores (n,
    K)``: a source's best ``width`` continuations are among its beams' own best ``width`` tokens
    (:func:`top_k`), so only those K·width are ranked, ties to the first beam, then token (beam
    search's rule: ``attnkit.decode.search.rank_continuations``, and a compiled beam step's where its
    vocabulary is too small to rank by blocks)."""
    V, (n, K) = log_probs.size(-1), scores.shape
    top_log_probs, top_tokens = top_k(log_probs, min(width, V))  # (n·K, w) each
    w = top_log_probs.size(-1)
    candidates = (top_log_probs + scores.view(-1, 1)).view(n, K * w)
    beams = torch.arange(K, device=scores.device).repeat_interleave(w)  # (K·w,): each candidate's beam
    flat = beams * V + top_tokens.reshape(n, K * w)  # (n, K·w): beam·V + token, the order ties go by
    best, chosen = first_k(candidates, min(width, K * w), flat)  # (n, width) each
    return best, chosen // V, chosen % V
