"""The search's passes over the vocabulary, faster on a CPU: the log-softmax written over the logits,
beam search's ranking by blocks of tokens, greedy search's argmax by blocks.

On a CPU each pass over a step's ``(N, V)`` matrix costs about as much as the rest of the search step,
so ``attnkit.decode.search`` asks these first; each returns None where it does not apply (another
device, a dtype or layout it does not handle, a vocabulary too small to pay), and the search then takes
its plain torch equivalent. The choices are the same either way (tests/decode/test_search.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.ranking import first_k


def log_softmax_in_place(logits: Tensor) -> Tensor | None:
    """``log_softmax(logits)`` written over ``logits (N, V)`` (a decoding step's, which the search may
    overwrite), on a CPU in float32; None elsewhere. Each pass over the matrix costs as much as the
    rest of the search step, and one into a second matrix more than one over the logits the product
    has just written (3.6% of a beam search, measured)."""
    overwritable = (
        logits.is_cpu
        and logits.dtype == torch.float32
        and logits.is_contiguous()
        and not logits.requires_grad
    )
    return torch.log_softmax(logits, -1, out=logits) if overwritable else None


BLOCK = 64  # consecutive tokens whose maximum stands for them in the first round of a blockwise top-k


@dataclass(frozen=True)
class RuledOut:
    """The tokens a step's rows may not take, as the search rules them out (``attnkit.decode.search``'s
    ``next_log_probs``): only the tokens ``ever (V,)`` generated, and in the rows ``at_limit (R,)`` (at
    their length bound) only ``end (V,)``, ``</s>`` alone. :func:`best_by_blocks` rules them out where
    it reads the logits (the block maxima, the chosen blocks' entries, the last partial block) instead
    of reading logits with them at ``-inf`` already: a compiled beam step (``trace.RankedStep``) then
    adds a float to each entry of its ``(R, V)`` logits on their way to the block maxima, where masks
    over the whole matrix took three masks read and combined per entry: the same bits, the step 15-20%
    faster (docs/benchmarks.md)."""

    ever: Tensor  # (V,) bool
    end: Tensor  # (V,) bool: one token
    at_limit: Tensor  # (R,) bool

    def block_maxima(self, logits: Tensor, blocks: int) -> Tensor:
        """The largest entry a row may take in each of the first ``blocks`` blocks of :data:`BLOCK`
        tokens of ``logits (R, V)``: ``(R, blocks)``, ``-inf`` for a block of none."""
        never = torch.zeros_like(self.ever, dtype=logits.dtype).masked_fill(~self.ever, float("-inf"))  # (V,)
        whole = logits[:, : blocks * BLOCK].unflatten(-1, (blocks, BLOCK))  # (R, blocks, BLOCK), a view
        maxima = (whole + never[: blocks * BLOCK].view(blocks, BLOCK)).amax(-1)  # (R, blocks)
        # a row at its bound: </s> in its block, nothing elsewhere (past the whole blocks: nothing here)
        end = self.end.long().argmax()  # (): the token of </s>
        ended = logits.index_select(1, end.view(1)).squeeze(1) + never[end]  # (R,)
        in_its_block = torch.arange(blocks, device=logits.device) == end // BLOCK  # (blocks,)
        at_end = torch.where(in_its_block, ended[:, None], float("-inf"))  # (R, blocks)
        return torch.where(self.at_limit[:, None], at_end, maxima)

    def applied(self, entries: Tensor, rows: Tensor, tokens: Tensor) -> Tensor:
        """``entries (..., E)`` of the rows ``rows (...)``, tokens ``tokens`` (broadcast to them), with
        those ruled out at ``-inf``."""
        allowed = _allowed(self.ever[tokens], self.end[tokens], self.at_limit[rows][..., None])
        return entries.masked_fill(~allowed, float("-inf"))

    def everywhere(self, logits: Tensor) -> Tensor:
        """``logits (R, V)``, every entry ruled out at ``-inf`` (a vocabulary too small to rank by
        blocks: the ranking reads every entry)."""
        allowed = _allowed(self.ever, self.end, self.at_limit[:, None])  # (R, V)
        return logits.masked_fill(~allowed, float("-inf"))


def _allowed(ever: Tensor, end: Tensor, at_limit: Tensor) -> Tensor:
    """The search's rule (``next_log_probs``), broadcast: a token ever generated, and in a row at its
    length bound only ``</s>``."""
    return ever & (~at_limit | end)


def best_by_blocks(
    log_probs: Tensor,
    scores: Tensor,
    width: int,
    normaliser: tuple[Tensor, Tensor] | None = None,
    ruled_out: RuledOut | None = None,
) -> tuple[Tensor, Tensor, Tensor] | None:
    """``attnkit.decode.search.best_continuations`` of ``log_probs (n·K, V)`` and ``scores (n, K)``, by
    blocks: a source's ``width`` best continuations lie in the ``width`` blocks, among all its beams'
    blocks of :data:`BLOCK` tokens, whose best continuation (the beam's score + the block's maximum) is
    highest, since a block outside them has ``width`` blocks above it, each holding a better one. So:
    block maxima (one read of ``log_probs``), the best ``width`` of each source's K·V/BLOCK, then the
    best ``width`` of those blocks' entries, with the tokens after the last whole block (V not a
    multiple of BLOCK) taken as they are. Two rankings of a few hundred entries per source, where
    ``top_k`` ranks per beam and then per source: a tenth of a beam-5 step's time on a CPU. None off a
    CPU or where the vocabulary holds too few blocks.

    ``normaliser``: ``log_probs`` are the logits still (with the tokens ruled out at ``-inf``), and
    ``(maximum, log_sum)``, each ``(n·K,)``, the terms of their log-softmax, ``(x - maximum) -
    log_sum``: it is applied only to the block maxima and the chosen blocks' entries, with the same
    result as to every entry first, since it keeps each row's order (every rounding is monotone). A
    compiled step ranks so (``attnkit.cpu.compiled.trace.RankedStep``): the log-probabilities are never
    written out over the whole ``(n·K, V)`` matrix. ``ruled_out``: the tokens ruled out are not at
    ``-inf`` in ``log_probs`` yet; they are ruled out where read (:class:`RuledOut`)."""
    (n, K), V = scores.shape, log_probs.size(-1)
    if not log_probs.is_cpu or width * BLOCK * 4 > V:  # elsewhere, or too few blocks to pay: None
        return None
    blocks = V // BLOCK
    every_row = torch.arange(n * K, device=scores.device)

    def normalised(x: Tensor, rows: Tensor) -> Tensor:  # x (..., entries) of rows (...)
        if normaliser is None:
            return x
        return (x - normaliser[0][rows][..., None]) - normaliser[1][rows][..., None]

    def allowed(x: Tensor, rows: Tensor, tokens: Tensor) -> Tensor:  # x (..., entries) of rows, tokens
        return x if ruled_out is None else ruled_out.applied(x, rows, tokens)

    whole = log_probs[:, : blocks * BLOCK].unflatten(-1, (blocks, BLOCK))  # (n·K, blocks, BLOCK), a view
    maxima = whole.amax(-1) if ruled_out is None else ruled_out.block_maxima(log_probs, blocks)
    maxima = normalised(maxima, every_row) + scores.view(-1, 1)  # (n·K, blocks): each block's best
    best_blocks = (
        first_k(maxima.view(n, K * blocks), width)[1].sort(dim=-1).values
    )  # (n, width): beam·blocks + block
    rows = torch.arange(n, device=scores.device)[:, None] * K + best_blocks // blocks  # (n, width)
    offsets = torch.arange(BLOCK, device=scores.device)
    tokens = (best_blocks % blocks * BLOCK)[..., None] + offsets  # (n, width, BLOCK)
    inside = allowed(whole[rows, best_blocks % blocks], rows, tokens)
    inside = normalised(inside, rows) + scores.view(-1)[rows][..., None]  # (n, width, BLOCK)
    flat = (best_blocks // blocks * V)[..., None] + tokens  # beam·V + token
    candidates, flat = inside.flatten(1), flat.flatten(1)  # (n, width·BLOCK) each
    tail = V - blocks * BLOCK
    if tail:  # the last tokens, of every beam: (n, K·tail)
        last = blocks * BLOCK + torch.arange(tail, device=scores.device)  # (tail,)
        after = allowed(log_probs[:, blocks * BLOCK :], every_row, last)
        after = (normalised(after, every_row) + scores.view(-1, 1)).view(n, K * tail)
        beams = torch.arange(K, device=scores.device).repeat_interleave(tail)  # (K·tail,)
        candidates = torch.cat([candidates, after], dim=1)
        flat = torch.cat([flat, (beams * V + last.repeat(K)).expand(n, -1)], dim=1)
    best, chosen = first_k(candidates, width, flat)  # (n, width) each, ties to the first beam and token
    return best, chosen // V, chosen % V


def block_argmax(log_probs: Tensor, block: int = 64) -> Tensor | None:
    """The most probable token of each row of ``log_probs (N, V)`` (the first of equals, as
    ``Tensor.argmax``), on a CPU (None elsewhere, or for a row of fewer than two blocks).

    On a CPU, torch's ``argmax`` over a row of thousands is several times slower than a maximum (330
    against 18 µs for 32 rows of 8,000, one thread): so the first block of ``block`` entries holding
    the row's maximum (block maxima, then their argmax: a short row), then the first maximum inside it,
    and the entries after the last whole block on their own; 5x faster, the same choice."""
    V = log_probs.size(-1)
    blocks = V // block
    if not log_probs.is_cpu or blocks < 2:
        return None
    tiled = log_probs[:, : blocks * block].unflatten(-1, (blocks, block))  # (N, blocks, block), a view
    maxima = tiled.amax(-1)  # (N, blocks)
    best = maxima.argmax(-1)  # (N,): the first block with the row's maximum
    inside = tiled.gather(1, best[:, None, None].expand(-1, 1, block)).squeeze(1).argmax(-1)  # (N,)
    token = best * block + inside
    if blocks * block < V:  # the last, partial block wins only with a larger entry
        tail = log_probs[:, blocks * block :]
        larger = tail.amax(-1) > maxima.gather(1, best[:, None]).squeeze(1)
        token = torch.where(larger, blocks * block + tail.argmax(-1), token)
    return token
