"""Beam search (the paper's §6.1, with the length penalties and stopping rules of ``decode/search.py``):
:class:`Beams` takes the steps of some sources' beams one at a time, as :func:`beam` runs them to the end
and as a server's running batch steps them while sources join and leave; :func:`beam_search` is the
encoder-decoder's entry point, as ``search.greedy`` is greedy search's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from attnkit.data.tokenizer import SpecialIds
from attnkit.decode.search import (
    Decoding,
    Hypothesis,
    Search,
    best_continuations,
    length_penalty,
    starts_of,
    staying,
)
from attnkit.models.decoding import stacked
from attnkit.models.seq2seq import EncoderDecoder

DEFAULT_SEARCH = Search()  # frozen: one default shared by every call


def beam(
    decoding: Decoding, tokens: Tensor, limits: Tensor, specials: SpecialIds, search: Search
) -> list[list[Hypothesis]]:
    """Beam search after ``tokens (B, t)``, one prefix per row, with ``decoding`` made for those B rows;
    the ``search.n_best`` best hypotheses per row, best first (its length bounds are ``limits``).
    :class:`Beams` does the steps."""
    beams = Beams(decoding, tokens, limits, specials, search)
    found: list[list[Hypothesis]] = [[] for _ in range(tokens.size(0))]
    while beams.sources:
        for source, hypotheses in beams.step():
            found[source] = hypotheses
    return found


class Beams:
    """Beam search of some sources, a step at a time: what :func:`beam` runs to the end, and what a
    server's running batch (decode/continuous.py) steps while sources join (:meth:`merge`) and leave.

    The first step runs on the B rows alone (all K beams of a row would start from the same prefix, so
    they would compute the same thing K times), then ``decoding.repeat(K)`` makes each row K beams.
    Each step takes every row's 2K best candidates (K beams × V tokens; 2K because up to K may end in
    ``</s>``). In score order, a candidate ending in ``</s>`` becomes a finished hypothesis while fewer
    than K others came before it (and, with ``stop="k-finished"``, while its row still needs some); the
    first K others are the next beams.
    This is done on tensors for all rows at once, with one read-back per step (the finished ones). A
    source whose search is over leaves the batch, so the steps after it run only on the others. Each
    source counts its own steps (sources that joined later are at earlier ones): its length bound and
    penalty are its own, and its tokens are right-aligned in ``tokens`` (padding before them).
    """

    def __init__(
        self,
        decoding: Decoding,
        tokens: Tensor,
        limits: Tensor,
        specials: SpecialIds,
        search: Search,
        sources: list | None = None,
    ) -> None:
        """``sources``: what :meth:`step` calls the B rows when they finish (default 0..B-1)."""
        B, device = tokens.size(0), tokens.device
        self.decoding, self.tokens, self.limits = decoding, tokens, limits  # limits (B,): ``beam``'s
        self.specials, self.search = specials, search
        self.sources = list(range(B)) if sources is None else list(sources)  # searched, in row order
        self.beams = 1  # rows per source: one until the first step has run, then K
        self.scores = torch.zeros((B, 1), device=device)  # (n, beams): each beam's log-probability so far
        self.steps = torch.zeros(B, dtype=torch.long, device=device)  # (n,): each source's steps so far
        self.finished: list[list[Hypothesis]] = [[] for _ in range(B)]  # each source's, in row order

    def step(self) -> list[tuple[int, list[Hypothesis]]]:
        """One step of every source; returns those whose search is over, with their ``n_best`` best
        hypotheses (best first), and takes them out."""
        K, device, specials = self.search.beam_size, self.tokens.device, self.specials
        patient, alpha, penalty = self.search.stop == "no-better", self.search.alpha, self.search.penalty
        n, beams, steps = len(self.sources), self.beams, self.steps
        first_beam = torch.arange(n, device=device)[:, None] * beams  # (n, 1): row of each source's beam 0
        at_limit = (steps + 1 >= self.limits).repeat_interleave(beams)  # (n·beams,)
        top_scores, chosen_beam, words = best_continuations(
            self.decoding, self.tokens, at_limit, specials, self.scores, 2 * K
        )  # (n, 2K) each, best first
        position = torch.arange(top_scores.size(1), device=device)  # a candidate's rank in its row
        rows = first_beam + chosen_beam  # the beam row of each
        needed = torch.tensor([K - (0 if patient else len(f)) for f in self.finished], device=device)
        needed = needed[:, None]  # (n, 1): hypotheses each row may still finish
        alive = (top_scores > float("-inf")) & (needed > 0)
        ends, goes_on = alive & (words == specials.eos), alive & (words != specials.eos)
        others_before = goes_on.cumsum(-1) - goes_on.long()  # candidates that go on, ranked higher
        ends &= (others_before < K) & (ends.cumsum(-1) <= needed)
        lengths = (steps + 1).tolist()  # each source's output length, </s> included, if it ends now
        penalties = [length_penalty(length, alpha, penalty) for length in lengths]
        columns = self.tokens.size(1)
        for i, p in ends.nonzero().tolist():  # its generated tokens: the last steps[i] columns
            hypothesis = self.tokens[rows[i, p], columns - lengths[i] + 1 :].tolist()
            self.finished[i].append(Hypothesis(hypothesis, top_scores[i, p].item() / penalties[i]))
        if patient:  # keep the K best; done when the best running beam, ended now, would not beat them
            running = torch.where(goes_on, top_scores, float("-inf")).amax(-1).tolist()
            self.finished = [sorted(f, key=lambda h: -h.score)[:K] for f in self.finished]
            done = [
                len(f) >= K and running[i] / penalties[i] <= f[-1].score for i, f in enumerate(self.finished)
            ]
        else:
            done = [len(f) >= K for f in self.finished]
        # a source at its bound is done too: it could only have ended in </s>
        done = [d or at for d, at in zip(done, (steps + 1 >= self.limits).tolist(), strict=True)]
        over = [(s, sorted(f, key=lambda h: -h.score)[: self.search.n_best])
                for s, f, d in zip(self.sources, self.finished, done, strict=True) if d]  # fmt: skip
        if all(done):
            self.sources, self.finished = [], []
            return over
        # The next beams: the first K candidates that go on, in score order; too few: dead beams.
        order = torch.where(goes_on, position, 2 * K + position)
        chosen = order.argsort(-1)[:, :K]  # (n, K)
        real = goes_on.gather(-1, chosen)
        index = torch.where(real, rows.gather(-1, chosen), first_beam)  # (n, K): rows of `tokens`
        next_tokens = torch.where(real, words.gather(-1, chosen), specials.pad)  # (n, K)
        self.scores = torch.where(real, top_scores.gather(-1, chosen), float("-inf"))  # (n, K)
        self.steps = steps + 1
        if over:  # the finished sources leave (the last ones take their places): their rows are neither
            # decoded nor kept
            order = staying(done)
            going = torch.tensor(order, dtype=torch.long, device=device)
            index, next_tokens, self.scores = index[going], next_tokens[going], self.scores[going]
            self.limits, self.steps = self.limits[going], self.steps[going]
            self.sources = [self.sources[i] for i in order]
            self.finished = [self.finished[i] for i in order]
        self.tokens = torch.cat([self.tokens[index.view(-1)], next_tokens.view(-1, 1)], dim=1)  # (n·K, t + 1)
        if beams != K:  # from now on K rows per source: row i becomes rows i·K .. i·K + K - 1, alike
            self.decoding.repeat(K)
            index, self.beams = index * K, K
        if over:
            self.tokens = self.tokens[:, self.decoding.keep(index.view(-1)) or 0 :]
        else:
            self.decoding.reorder(index.view(-1))
        return over

    def merge(self, other: Beams) -> None:
        """Add the sources of ``other`` (the same search, past its first step, with prefixes as long as
        these) after these: sources that came while these were searched (decode/continuous.py). Their
        decodings merge too (``Seq2SeqDecoding.merge``); the shorter tokens are padded on the left."""
        K = self.search.beam_size
        if other.search != self.search or other.beams != K:
            raise ValueError("only searches with the same settings, past their first step, merge")
        if not self.sources:  # nothing left here: the other's search goes on alone
            self.__dict__.update(other.__dict__)
            return
        if self.beams != K:
            raise ValueError("merge a search into one past its first step")
        self.tokens = stacked(self.tokens, other.tokens, 1, self.specials.pad, left=True)
        self.decoding.merge(other.decoding)  # type: ignore[attr-defined]
        self.scores, self.limits = (
            torch.cat([self.scores, other.scores]),
            torch.cat([self.limits, other.limits]),
        )
        self.steps = torch.cat([self.steps, other.steps])
        self.sources, self.finished = self.sources + other.sources, self.finished + other.finished

    def leave(self, sources: set) -> None:
        """Take ``sources`` out (their hypotheses unfinished: nobody waits for them any more)."""
        gone = [source in sources for source in self.sources]
        if not any(gone):
            return
        order = staying(gone)  # the last sources take the places of those that leave
        kept = torch.tensor(order, dtype=torch.long, device=self.tokens.device)  # (n',)
        rows = (kept[:, None] * self.beams + torch.arange(self.beams, device=kept.device)).view(-1)
        self.scores, self.limits, self.steps = self.scores[kept], self.limits[kept], self.steps[kept]
        self.sources = [self.sources[i] for i in order]
        self.finished = [self.finished[i] for i in order]
        if order:
            self.tokens = self.tokens[rows][:, self.decoding.keep(rows) or 0 :]


@torch.no_grad()
def beam_search(
    model: EncoderDecoder,
    src: Tensor,
    specials: SpecialIds,
    search: Search = DEFAULT_SEARCH,
    *,
    use_cache: bool = True,
    decoding: Callable[[Tensor, bool], Decoding] | None = None,
) -> list[list[Hypothesis]]:
    """The ``search.n_best`` best hypotheses per source (fewer if fewer finished), best first;
    ``decoding`` as for :func:`greedy`."""
    start, limits = starts_of(src, specials, search)
    steps = (decoding or model.decoding)(src, use_cache)  # encoded once; beam() makes each row K beams
    return beam(steps, start, limits, specials, search)
