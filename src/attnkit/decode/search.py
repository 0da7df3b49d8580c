"""Search, written once for every generative model: greedy, sampling and beam search.

A model offers step-by-step decoding through a small object (:class:`Decoding`): ``next_logits(tokens)``
gives the logits of the next token after all tokens so far (a model with a KV cache runs only the new
ones) and ``reorder(index)`` keeps the given rows. ``EncoderDecoder.decoding(src)`` and
``DecoderModel.decoding(prompt_valid)`` make one; :func:`greedy` below and ``beams.beam_search`` are the
encoder-decoder's entry points, ``decode/generate.py`` the decoder-only model's. This module holds what
every search shares (the settings, the length bounds and penalties, the next token's log-probabilities
and best continuations) and the searches that extend each row by one token a step (greedy, sampling:
``sampling.py``); ``beams.py`` holds beam search.

Output length is bounded per row (``limits``, in generated tokens including ``</s>``): for translation
``max_len_a · source_length + max_len_b`` (fairseq's rule), never more than ``max_output_len`` (what the
model supports, e.g. its learned positions). At the bound ``</s>`` is the only choice left, in every
search alike, and ``<pad>`` and ``<s>`` are never generated (unless one of them is also ``</s>``, as
GPT-2's ``<|endoftext|>`` is). The special ids come from the tokenizer's :class:`SpecialIds`.

Beam search ranks finished hypotheses by ``log P(Y|X) / lp(Y)``, where ``|Y|`` counts the generated
tokens including ``</s>``: with ``length_penalty="length"`` ``lp(Y) = |Y| ** alpha`` (the length
normalisation of fairseq, HF ``generate`` and CTranslate2), with ``"gnmt"`` the GNMT length penalty
(Wu et al., 2016, eq. 14) ``lp(Y) = ((5 + |Y|) / 6) ** alpha``; ``alpha = 0`` ranks by plain
log-probability. The first favours long outputs more strongly for the same ``alpha``.

A row's search ends at its length bound, or earlier by one of two rules (``stop``): ``"no-better"`` (HF
``generate``'s default) keeps the K best finished hypotheses and ends when none of the running beams,
scored as if it ended now, beats the worst of them (with ``alpha = 0`` exactly when none can);
``"k-finished"`` (fairseq's) ends as soon as K hypotheses have finished. The first searches a little
longer and scored 1.0 BLEU more on Multi30k's test set at the same ``alpha`` (docs/results.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from attnkit.config import BEAM_STOPS, LENGTH_PENALTIES, DecodeConfig
from attnkit.cpu.search import best_by_blocks, block_argmax, log_softmax_in_place
from attnkit.data.tokenizer import SpecialIds
from attnkit.models.decoding import stacked
from attnkit.models.seq2seq import EncoderDecoder
from attnkit.ranking import best_continuations_by_top_k

# log-probabilities (n, V) and which of the N rows they are (n,) -> the next token of each (n,)
Choose = Callable[[Tensor, Tensor], Tensor]


class Decoding(Protocol):
    """Step-by-step decoding, as a generative model offers it (see the module docstring); a
    sequence-to-sequence model's also offers ``repeat(k)`` (each row becomes k consecutive rows, beam
    search's beams, after the first step: the sources encoded once, the first step run once).

    ``reorder(index)`` only ever moves rows among the beams of one source (which share its encoding);
    ``keep(index)`` keeps rows of any sources, as search does when it drops the finished ones; after
    rows that began at other steps have joined (``merge``, continuous batching), it may forget
    positions no row reads any more (the padding before every row's tokens) and returns how many:
    the search drops as many leading columns of its tokens. ``next_logits`` returns a tensor of its
    own making, which search may overwrite. A decoding may also offer ``ranked``, beam search's ranking
    of the continuations done in its own step (:func:`best_continuations` asks it first)."""

    def next_logits(self, tokens: Tensor) -> Tensor: ...

    def reorder(self, index: Tensor) -> None: ...

    def keep(self, index: Tensor) -> int | None: ...


@dataclass(frozen=True)
class BeamSettings:
    """A search's width and what it keeps: ``beam`` rows per source (1: greedy search) and the
    ``n_best`` best hypotheses (at most ``beam``), the rule checked here for every caller (the command
    line, the server's requests, ``translate``, :class:`Search`), which word its error their own way."""

    beam: int = 5
    n_best: int = 1

    def __post_init__(self) -> None:
        if self.beam < 1:
            raise ValueError(f"beam_size must be at least 1, got {self.beam}")
        if self.n_best < 1:
            raise ValueError(f"n_best must be at least 1, got {self.n_best}")
        if self.n_best > self.beam:
            raise ValueError(f"n_best ({self.n_best}) must not exceed the beam size ({self.beam})")


@dataclass(frozen=True)
class Search:
    """The settings of one search (see the module docstring): a beam of ``beam_size`` (greedy search
    takes only the length bounds), finished hypotheses ranked by ``penalty`` with ``alpha``, the
    ``n_best`` best kept, the stopping rule ``stop``, and each output bounded to ``max_len_a · source
    length + max_len_b`` tokens, never more than ``max_output_len`` (None: no bound but that)."""

    beam_size: int = 5
    alpha: float = 1.0
    n_best: int = 1
    penalty: str = "length"
    stop: str = "no-better"
    max_len_a: float = 1.5
    max_len_b: int = 10
    max_output_len: int | None = None

    def __post_init__(self) -> None:
        BeamSettings(self.beam_size, self.n_best)  # the rule of the two
        if self.stop not in BEAM_STOPS:
            raise ValueError(f"unknown stopping rule {self.stop!r}; choose one of {', '.join(BEAM_STOPS)}")
        if self.penalty not in LENGTH_PENALTIES:
            choices = ", ".join(LENGTH_PENALTIES)
            raise ValueError(f"unknown length penalty {self.penalty!r}; choose one of {choices}")

    @classmethod
    def of(cls, decode: DecodeConfig, **changes: object) -> Search:
        """The search a run's decoding settings ask for, with ``changes`` (``beam_size=1``...)."""
        settings = {
            "beam_size": decode.beam_size,
            "alpha": decode.alpha,
            "penalty": decode.length_penalty,
            "stop": decode.beam_stop,
            "max_len_a": decode.max_len_a,
            "max_len_b": decode.max_len_b,
        }
        return cls(**{**settings, **changes})  # type: ignore[arg-type]

    def output_limit(self, source_length: int) -> int:
        """The bound on the output of a source of ``source_length`` tokens (``</s>`` included): what
        :func:`limits_of` computes for a batch."""
        limit = max(1, int(self.max_len_a * source_length + self.max_len_b))
        return limit if self.max_output_len is None else min(limit, self.max_output_len)

    def positions(self, source_lengths: list[int]) -> int:
        """The token positions a search of sources of ``source_lengths`` holds at most: each source's
        ``beam_size`` rows, each row its source and the longest output it may write (what a server
        admits its requests by: rows × positions)."""
        return sum(self.beam_size * (n + self.output_limit(n)) for n in source_lengths)


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, without the prefix (<s> or the prompt) and without </s>
    score: float  # length-normalised log-probability


class Translation(NamedTuple):
    """A hypothesis as its reader gets it (``translate`` with ``n_best``, a server's answer): its text,
    its score, and ``tokens``, how many tokens the model generated for it (``</s>`` not counted): what a
    server counts as output tokens, from the search itself rather than by tokenising the text again."""

    text: str
    score: float
    tokens: int


def length_penalty(length: int, alpha: float, kind: str = "length") -> float:
    """``|Y| ** alpha`` (``kind="length"``) or GNMT's ``((5 + |Y|) / 6) ** alpha`` (``"gnmt"``)."""
    if kind == "length":
        return length**alpha
    if kind == "gnmt":
        return ((5 + length) / 6) ** alpha
    raise ValueError(f"unknown length penalty {kind!r}; choose one of {', '.join(LENGTH_PENALTIES)}")


def next_log_probs(
    decoding: Decoding, tokens: Tensor, at_limit: Tensor, specials: SpecialIds, normalised: bool = True
) -> Tensor:
    """Log-probabilities of the next token after ``tokens (N, t)``: ``(N, V)``, in float32 at least.

    ``<pad>`` and ``<s>`` are never generated; rows ``at_limit`` may only end (``</s>``), keeping the
    model's probability of ending so that scores stay true log-probabilities. ``normalised=False``
    leaves the logits as the model gives them, with the same tokens ruled out: what a choice that only
    compares a row's entries (greedy search's argmax) needs, one pass over ``(N, V)`` cheaper.
    """
    logits = decoding.next_logits(tokens)
    return only_allowed(log_probs_of(logits) if normalised else logits, at_limit, specials)


def log_probs_of(logits: Tensor) -> Tensor:
    """``logits (N, V)``' log-softmax over each row, in float32 at least (in place where it can be)."""
    log_probs = log_softmax_in_place(logits)  # on a CPU: see attnkit.cpu.search
    if log_probs is None:
        log_probs = logits.log_softmax(-1, dtype=torch.promote_types(logits.dtype, torch.float32))
    return log_probs


def never_generated(specials: SpecialIds) -> list[int]:
    """The tokens no search generates: ``<pad>`` and ``<s>``, unless one of them is also ``</s>``."""
    return sorted({specials.pad, specials.bos} - {specials.eos})


def only_allowed(scores: Tensor, at_limit: Tensor, specials: SpecialIds) -> Tensor:
    """``scores (N, V)`` with the tokens never generated, and every token but ``</s>`` in rows
    ``at_limit``, ruled out (``-inf``, in place)."""
    scores[:, never_generated(specials)] = float("-inf")
    if at_limit.any():
        end = scores[at_limit, specials.eos]
        scores[at_limit] = float("-inf")
        scores[at_limit, specials.eos] = end
    return scores


def best_continuations(
    decoding: Decoding, tokens: Tensor, at_limit: Tensor, specials: SpecialIds, scores: Tensor, width: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The ``width`` best one-token continuations of each source's K beams, as beam search ranks them
    (:func:`rank_continuations`; a decoding that offers ``ranked``, taking the same arguments, ranks
    them in its own step where it can, and returns None where it cannot).

    ``tokens (n·K, t)`` are the beams (K consecutive rows per source), ``scores (n, K)`` their
    log-probabilities so far. A continuation's score is ``score + log p(token)``, with ``log p`` as
    :func:`next_log_probs` gives it; returns ``(scores, beam, token)``, each ``(n, width)``, best
    first, ``beam`` in 0..K-1. The same as the top ``width`` of all K·V continuations, but without
    adding the scores to, and ranking, all of them: on a CPU, by blocks of tokens
    (:func:`attnkit.cpu.search.best_by_blocks`); elsewhere, a source's best ``width`` continuations are
    among its beams' own best ``width`` tokens (:func:`attnkit.ranking.top_k`), so only those K·width
    are ranked.
    """
    ranked = getattr(decoding, "ranked", None)  # a decoding whose step ranks too (decode/compiled.py)
    found = ranked(tokens, at_limit, specials, scores, width) if ranked is not None else None
    if found is not None:
        return found
    return rank_continuations(next_log_probs(decoding, tokens, at_limit, specials), scores, width)


def rank_continuations(log_probs: Tensor, scores: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`best_continuations` of the next tokens' ``log_probs (n·K, V)`` (as :func:`next_log_probs`
    gives them) and the beams' ``scores (n, K)``: ``(scores, beam, token)``, each ``(n, width)``, best
    first. A compiled beam step ranks by the same rule (``attnkit.cpu.compiled.trace.RankedStep``)."""
    by_blocks = best_by_blocks(log_probs, scores, width)  # on a CPU: see attnkit.cpu.search
    if by_blocks is not None:
        return by_blocks
    return best_continuations_by_top_k(log_probs, scores, width)


def extend(
    decoding: Decoding,
    tokens: Tensor,
    limits: Tensor,
    specials: SpecialIds,
    choose: Choose,
    observe: Callable[[Tensor], Tensor | None] | None = None,
) -> list[list[int]]:
    """Append one token per step to every row of ``tokens (N, t)`` (``<s>``, or a prompt) until it has
    ended or reached its limit; returns the generated ids of each row, without ``</s>``.

    ``choose`` picks each row's next token (:func:`argmax` for greedy search, which is given the logits
    rather than the log-probabilities: the same order, one pass fewer; or a sampler); ``observe``, if
    given, sees the generated tokens ``(N, steps)`` after every step (``<pad>`` after a row's end; to
    stream them) and may return a mask of rows to end there (stop strings). A row that has ended leaves
    the batch: later steps run only on the others. :class:`Extension` takes the steps.
    """
    extension = Extension(decoding, tokens, limits, specials, choose)
    generated = tokens.new_full((tokens.size(0), 0), specials.pad)  # (N, steps), every row's

    def stop(next_token: Tensor, rows: Tensor) -> Tensor | None:
        nonlocal generated
        column = generated.new_full((generated.size(0), 1), specials.pad)
        column[rows, 0] = next_token
        generated = torch.cat([generated, column], dim=1)
        ends = observe(generated)
        return None if ends is None else ends[rows]

    found: list[list[int]] = [[] for _ in range(tokens.size(0))]
    while len(extension.rows):
        for row, ids in extension.step(stop if observe is not None else None):
            found[row] = ids
    return found


class Extension:
    """The rows :func:`extend` extends, a step at a time: what it runs to the end, and what a server's
    running batch (decode/continuous.py) steps while rows join (:meth:`merge`) and leave. Each row
    counts its own steps (rows that joined later are at earlier ones) and its tokens are right-aligned
    in ``tokens`` (padding before them)."""

    def __init__(
        self,
        decoding: Decoding,
        tokens: Tensor,
        limits: Tensor,
        specials: SpecialIds,
        choose: Choose,
        rows: Tensor | None = None,
    ) -> None:
        """``rows (N,)``: each row's number, what ``choose`` is told (a sampler's generator) and what
        :meth:`step` calls it when it ends (default 0..N-1)."""
        N, device = tokens.size(0), tokens.device
        self.decoding, self.tokens, self.limits = decoding, tokens, limits  # limits (N,): ``extend``'s
        self.specials, self.choose = specials, choose
        self.rows = torch.arange(N, device=device) if rows is None else rows  # (n,): the rows still extended
        self.steps = torch.zeros(N, dtype=torch.long, device=device)  # (n,): tokens each has generated

    def step(
        self, stop: Callable[[Tensor, Tensor], Tensor | None] | None = None
    ) -> list[tuple[int, list[int]]]:
        """One token more for every row; returns the rows that have ended, with their generated ids
        (without ``</s>``), and takes them out. ``stop(next_token (n,), rows (n,))`` may return a mask
        of rows to end there (stop strings, clients gone)."""
        specials = self.specials
        at_limit = self.steps + 1 >= self.limits
        normalised = self.choose is not argmax
        log_probs = next_log_probs(self.decoding, self.tokens, at_limit, specials, normalised=normalised)
        next_token = self.choose(log_probs, self.rows)  # (n,)
        self.tokens = torch.cat([self.tokens, next_token[:, None]], dim=1)
        self.steps = self.steps + 1
        ended = next_token == specials.eos
        ends = stop(next_token, self.rows) if stop is not None else None
        if ends is not None:
            ended |= ends
        ended |= at_limit  # (there, </s> was the only choice)
        return self._ending(ended)

    def took(self, tokens: Tensor, counts: Tensor, ended: Tensor) -> list[tuple[int, list[int]]]:
        """After a step that gave each row ``counts (n,)`` tokens (a check of drafts: decode/speculative.py's
        ``check``), ``tokens (n, t')`` holding them last in each row: the rows ``ended (n,)`` end there;
        returns them as :meth:`step` does."""
        self.tokens, self.steps = tokens, self.steps + counts
        return self._ending(ended)

    def _ending(self, ended: Tensor) -> list[tuple[int, list[int]]]:
        """The rows ``ended (n,)``, with their generated ids (without ``</s>``), taken out."""
        if not ended.any():
            return []
        specials, columns, steps = self.specials, self.tokens.size(1), self.steps.tolist()
        done = [(row, _strip(self.tokens[i, columns - steps[i] :].tolist(), specials))
                for i, row in enumerate(self.rows.tolist()) if ended[i]]  # fmt: skip
        going = torch.tensor(staying(ended.tolist()), dtype=torch.long, device=self.tokens.device)
        self.rows, self.steps, self.limits = self.rows[going], self.steps[going], self.limits[going]
        if len(going):
            self.tokens = self.tokens[going][:, self.decoding.keep(going) or 0 :]
        return done

    def leave(self, rows: set[int]) -> None:
        """Take ``rows`` out (nobody waits for them any more)."""
        gone = [row in rows for row in self.rows.tolist()]
        if not any(gone):
            return
        going = torch.tensor(staying(gone), dtype=torch.long, device=self.rows.device)
        self.rows, self.steps, self.limits = self.rows[going], self.steps[going], self.limits[going]
        self.tokens = self.tokens[going]
        if len(going):
            self.tokens = self.tokens[:, self.decoding.keep(going) or 0 :]

    def merge(self, other: Extension) -> None:
        """Add ``other``'s rows after these (rows that came while these were extended); their
        decodings merge too; the shorter tokens are padded on the left."""
        if not len(self.rows):
            self.__dict__.update(other.__dict__)
            return
        self.tokens = stacked(self.tokens, other.tokens, 1, self.specials.pad, left=True)
        self.decoding.merge(other.decoding)  # type: ignore[attr-defined]
        self.rows, self.steps = torch.cat([self.rows, other.rows]), torch.cat([self.steps, other.steps])
        self.limits = torch.cat([self.limits, other.limits])


def staying(ended: list[bool]) -> list[int]:
    """The rows that go on after those ``ended`` leave, in their new order: each in its place, but the
    last ones, which move into the places of those that left (in order). Rows that stay where they were
    are not copied when the caches keep them (``models.row_buffers``: only the moved ones are)."""
    count = ended.count(False)
    order = list(range(count))
    movers = (i for i in range(count, len(ended)) if not ended[i])  # as many as places left in [0, count)
    for place in (i for i in range(count) if ended[i]):
        order[place] = next(movers)
    return order


def _strip(ids: list[int], specials: SpecialIds) -> list[int]:
    if specials.eos in ids:
        return ids[: ids.index(specials.eos)]
    return [i for i in ids if i != specials.pad]


def argmax(log_probs: Tensor, rows: Tensor | None = None) -> Tensor:
    """Greedy choice: the most probable token of each row (the first of equals, as ``Tensor.argmax``),
    on a CPU by blocks (:func:`attnkit.cpu.search.block_argmax`: several times faster, the same
    choice)."""
    found = block_argmax(log_probs)
    return log_probs.argmax(-1) if found is None else found


# --- the encoder-decoder's entry points ------------------------------------------------------------


def limits_of(src: Tensor, pad_id: int, search: Search) -> Tensor:
    """Each source's bound on its output's tokens (``</s>`` included): see the module docstring."""
    src_lengths = (src != pad_id).sum(-1)
    limits = (search.max_len_a * src_lengths + search.max_len_b).long()
    return limits.clamp(min=1, max=search.max_output_len)  # (B,)


def starts_of(src: Tensor, specials: SpecialIds, search: Search) -> tuple[Tensor, Tensor]:
    """Where a search of the sources ``src (B, S)`` starts: each row's first token, ``<s>`` ``(B, 1)``,
    and its output's bound ``(B,)`` (:func:`limits_of`)."""
    start = torch.full((src.size(0), 1), specials.bos, dtype=torch.long, device=src.device)
    return start, limits_of(src, specials.pad, search)


@torch.no_grad()
def greedy(
    model: EncoderDecoder,
    src: Tensor,
    specials: SpecialIds,
    search: Search = Search(),
    *,
    use_cache: bool = True,
    decoding: Callable[[Tensor, bool], Decoding] | None = None,
) -> list[list[int]]:
    """The most probable next token at every step, for a batch of sources ``(B, S)``, within the
    search's length bounds; ``decoding``: how to decode step by step (default ``model.decoding``;
    ``decode.steps`` hands its own)."""
    start, limits = starts_of(src, specials, search)
    return extend((decoding or model.decoding)(src, use_cache), start, limits, specials, argmax)
