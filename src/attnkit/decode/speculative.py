"""Exact speculative decoding (Leviathan et al., 2023; Chen et al., 2023) of greedy search: a cheap draft
proposes the next few tokens of each row, the model checks them all in one step, and each row keeps
the drafted tokens the model would have chosen itself, then the model's own choice after them.

Decoding one sentence on a CPU is bound by reading the weights once per token: a step of five new
positions costs little more than a step of one. Where a draft is right, one step then yields several
tokens; where it is wrong, the step still yields the model's own next token, as a plain step would.
The output is **exactly** greedy search's (:func:`attnkit.decode.search.extend` with ``argmax``),
token for token, because every checked position's logits are the bits a step of one token would give
it (``Seq2SeqDecoding.checked_logits``: the linear maps sum each row alike however many rows they
take, and attention attends each position's query as that step would; docs/invariance.md), and the
choice at each position is the same ``argmax`` under the same rules (the length bound, the tokens
never generated). The tests compare both searches token for token.

The drafts come from decode/drafts.py: the source's own tokens (``decode.speculative=source``,
prompt lookup; a decoder's prompt and text so far), a one-layer draft decoder's guesses (``shallow``)
or another checkpoint's smaller model's (a checkpoint's folder). What a row keeps of its draft is a
:data:`Judge`: greedy search's rule here, or speculative sampling's acceptance rule
(decode/speculative_sampling.py), with which the same search samples from the model's distribution.
A decoder-only model's greedy generation (decode/generate.py) checks them alike, through
``CausalDecoding``'s ``checked_logits`` and ``rewind``, its stop strings and streaming observed after
each step as ``extend`` observes them. Each row's draft grows by two
tokens while the model takes all of it and shrinks by one when it does not (as HF's assisted
generation adapts its draft); a row whose draft the model refuses outright drafts nothing for its
next step, then for two, four, ... up to :data:`LONGEST_PAUSE` steps while refusals go on
(:class:`Pace`), so where drafts are poor (source drafts for a translation between languages, which
shares little but names and numbers with its source) nearly every step is a plain one.

After a check, rows have kept different numbers of tokens: the caches and tokens of those that kept
fewer are shifted right (``Seq2SeqDecoding.rewind``, ``realigned``), as continuous batching aligns
rows that began at different steps, and each row goes on at its own position.

Whether drafts pay depends on the model and the machine as much as on the drafts: a small model
whose weights sit in the processor's cache pays for a check of four tokens nearly what four steps
cost (docs/benchmarks.md). So each batch is timed, and :class:`Economy` keeps, per model and kind
of drafts, the seconds a generated token took in recent batches searched with drafts and without;
a batch drafts where that has been the cheaper, and one batch in :data:`EXPLORE_EVERY` searches the
other way, so that the choice follows the costs as they change. Either way its output is the same.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from attnkit.data.tokenizer import SpecialIds
from attnkit.decode.drafts import Drafts
from attnkit.decode.search import (
    Decoding,
    Hypothesis,
    Search,
    argmax,
    length_penalty,
    log_probs_of,
    only_allowed,
    staying,
)
from attnkit.models.decoding import realigned

# a row's draft length: at first, and at most (it grows by 2 while taken whole, shrinks by 1 otherwise)
DRAFT_FIRST, DRAFT_MOST = 4, 10
# the most steps a row drafts nothing for after its drafts were refused outright (see Pace)
LONGEST_PAUSE = 16
# drafts are checked only in the steps where at most this many rows are left: a step of several rows
# already shares each read of the weights among them, and rows that keep different numbers of tokens
# then need their caches realigned and masked (a batch of 8 Multi30k sentences, all drafting with the
# shallow draft: half plain greedy's tokens/s); a batch's last sentence drafts
ROWS_DRAFTED = 1
_ADDING = threading.Lock()  # (Speculation.add)
Searched = TypeVar("Searched")  # what a search gives (Economy.searched)
# one batch in this many searches the way the costs so far did not choose (see the module docstring)
EXPLORE_EVERY = 16
# the weight of a batch's seconds and tokens in the moving sums Economy compares
RECENT = 0.2


class Checking(Decoding, Protocol):
    """A decoding that checks drafts (``Seq2SeqDecoding``): the logits after each of the last ``count``
    tokens in one step, each the bits of a step of one token, and the rewinding of the positions a
    draft's refused tokens left in the cache."""

    def checked_logits(self, tokens: Tensor, count: int) -> Tensor: ...

    def rewind(self, kept: Tensor, checked: int) -> None: ...


@dataclass
class Pace:
    """How long a row's next draft is (see the module docstring): ``length`` tokens, after ``pause``
    steps without one; ``refused``: how many steps the last pause was (doubled at each refusal)."""

    length: int = DRAFT_FIRST
    pause: int = 0
    refused: int = 0

    def next(self, room: int) -> int:
        """The next draft's length, within ``room`` tokens (0: a plain step)."""
        if self.pause:
            self.pause -= 1
            return 0
        return max(0, min(self.length, room))

    def heard(self, proposed: int, taken: int) -> None:
        """The model took ``taken`` of the ``proposed`` tokens."""
        if not proposed:
            return
        if taken == proposed:
            self.length, self.refused = min(DRAFT_MOST, self.length + 2), 0
        elif taken:
            self.length, self.refused = max(1, self.length - 1), 0
        else:
            self.length = max(1, self.length - 1)
            self.refused = min(LONGEST_PAUSE, 2 * self.refused or 1)
            self.pause = self.refused


@dataclass
class Speculation:
    """What the drafts did: tokens proposed, tokens the model took, rows stepped (a step of n rows
    counts n), tokens generated (``</s>`` included)."""

    proposed: int = 0
    taken: int = 0
    steps: int = 0
    generated: int = 0

    def add(self, other: Speculation) -> None:
        """Count ``other``'s too (searches in several threads add theirs to one count: one at a time)."""
        with _ADDING:
            for name in ("proposed", "taken", "steps", "generated"):
                setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def acceptance(self) -> float:
        """The share of proposed tokens the model took."""
        return self.taken / self.proposed if self.proposed else 0.0

    @property
    def per_step(self) -> float:
        """Tokens a row generated a step (1.0 without drafts)."""
        return self.generated / self.steps if self.steps else 0.0


class Economy:
    """Whether a batch of one model's greedy search checks drafts of one kind (see the module
    docstring): :meth:`drafting` says, :meth:`heard` is told what a batch took. The first batch
    drafts, the second does not; then each batch takes the way whose tokens have cost less (moving
    sums of seconds and tokens, so long batches weigh more), and every :data:`EXPLORE_EVERY`-th the
    other. Searches in several threads share it: one at a time."""

    def __init__(self) -> None:
        self.spent: dict[bool, tuple[float, float]] = {}  # drafted or not: (seconds, tokens), moving sums
        self.batches = 0
        self.lock = threading.Lock()

    def drafting(self) -> bool:
        with self.lock:
            self.batches += 1
            if True not in self.spent or False not in self.spent:
                return True not in self.spent
            (seconds, tokens), (plain_seconds, plain_tokens) = self.spent[True], self.spent[False]
            cheaper = seconds * plain_tokens < plain_seconds * tokens  # seconds a token, compared
            return cheaper != (self.batches % EXPLORE_EVERY == 0)

    def searched(
        self,
        with_drafts: Callable[[], Searched],
        without: Callable[[], Searched],
        tokens: Callable[[Searched], int] = lambda outputs: sum(len(ids) + 1 for ids in outputs),
    ) -> Searched:
        """What one of two searches of the same outputs gives, the one :meth:`drafting` chooses, timed
        and told to :meth:`heard` with the ``tokens`` it generated (by default: a batch's ids, each
        row's without ``</s>``, and its ``</s>``)."""
        drafted = self.drafting()
        began = time.perf_counter()
        outputs = with_drafts() if drafted else without()
        self.heard(drafted, time.perf_counter() - began, tokens(outputs))
        return outputs

    def heard(self, drafted: bool, seconds: float, tokens: int) -> None:
        """A batch searched with drafts (``drafted``) or without took ``seconds`` for ``tokens``."""
        with self.lock:
            before = self.spent.get(drafted)
            if before is None:
                self.spent[drafted] = (seconds, float(tokens))
            else:
                old = 1.0 - RECENT
                self.spent[drafted] = (old * before[0] + RECENT * seconds, old * before[1] + RECENT * tokens)


_ECONOMIES: weakref.WeakKeyDictionary[object, dict[str, Economy]] = weakref.WeakKeyDictionary()
_FINDING = threading.Lock()


def economy(model: object, drafts: str) -> Economy:
    """The :class:`Economy` of ``model``'s greedy search with drafts of kind ``drafts``, for the process."""
    with _FINDING:
        return _ECONOMIES.setdefault(model, {}).setdefault(drafts, Economy())


# what a row keeps of its draft after a check: ``judge(scores (n, d + 1, V), rows, proposals)``, each
# row's kept drafted tokens and then one of the model's (greedy: those it would have chosen itself;
# sampling: decode/speculative_sampling.py's acceptance rule), given the scores at each checked
# position (log-probabilities, or logits for greedy search without ``normalised``)
Judge = Callable[[Tensor, list[int], list[list[int]]], list[list[int]]]


def greedy_judge(scores: Tensor, rows: list[int], proposals: list[list[int]]) -> list[list[int]]:
    """Greedy search's :data:`Judge`: each row's drafted tokens the model would have chosen itself (its
    ``argmax`` at each position), in order, then its own choice after them."""
    n, width, V = scores.shape
    choices = argmax(scores.view(-1, V)).view(n, width).tolist()  # (n, d + 1): the model's own choice at each
    kept = []
    for proposal, chosen in zip(proposals, choices, strict=True):
        taken = 0
        while taken < len(proposal) and proposal[taken] == chosen[taken]:
            taken += 1
        kept.append(chosen[: taken + 1])
    return kept


class OneBeam:
    """Beam search's :data:`Judge` for a beam of one (a server's greedy request, ``translate --beam 1
    --n-best 1``: scored): each position's choice is the token whose score so far plus its
    log-probability, rounded in float32 as ``Beams`` adds them, is highest (the first of equals, as
    ``Beams`` ranks them), so that a row keeps what a beam of one would have chosen bit for bit where two
    log-probabilities round to one score; it stops after ``</s>``. ``scores (N,)``: each row's
    log-probability before the check (by the row's number), and after it, that of the tokens it kept."""

    def __init__(self, scores: Tensor, eos: int) -> None:
        self.scores, self.eos = scores, eos

    def __call__(self, log_probs: Tensor, rows: list[int], proposals: list[list[int]]) -> list[list[int]]:
        kept, scores = [], self.scores.clone()
        for i, (r, proposal) in enumerate(zip(rows, proposals, strict=True)):
            score, chosen = scores[r], []
            for j in range(len(proposal) + 1):
                candidates = score + log_probs[i, j]  # (V,): the beam's continuations, as Beams ranks them
                token = int(argmax(candidates[None])[0])
                chosen.append(token)
                score = candidates[token]
                if j == len(proposal) or proposal[j] != token or token == self.eos:
                    break
            kept.append(chosen)
            scores[r] = score
        self.scores = scores
        return kept

    def hypothesis(self, row: int, tokens: list[int], search: Search) -> Hypothesis:
        """Row ``row``'s output ``tokens`` (without ``</s>``, which ended it) as a beam of one gives it:
        scored by its log-probability over the length penalty of its length with ``</s>``."""
        penalty = length_penalty(len(tokens) + 1, search.alpha, search.penalty)
        return Hypothesis(tokens, self.scores[row].item() / penalty)


def speculative_search(
    decoding: Checking,
    tokens: Tensor,
    limits: Tensor,
    specials: SpecialIds,
    drafts: Drafts,
    speculation: Speculation | None = None,
    most_rows: int = ROWS_DRAFTED,
    *,
    normalised: bool = False,
    observe: Callable[[Tensor], Tensor | None] | None = None,
    judge: Judge = greedy_judge,
    plain_first: bool = False,
) -> list[list[int]]:
    """Greedy search (or, with speculative sampling's ``judge``, sampling) after ``tokens (N, t)``
    (``<s>``, or left-padded prompts), each row within its bound ``limits (N,)``, with ``drafts``
    checked at every step where at most ``most_rows`` rows are left (see the module docstring): each
    row's generated ids without ``</s>``, greedy search's exactly as ``extend(decoding,
    tokens, limits, specials, choose, observe)`` gives them, ``choose`` taking each row's most probable
    token: by its logits (translate's :func:`~attnkit.decode.search.argmax`), or with ``normalised`` by
    its log-probabilities (generate's greedy sampler, which ranks them: rounded, two logits may tie).
    ``observe`` (generate's stop strings and streaming, as ``extend`` calls it) sees every row's tokens
    after each step; a row it ends may have taken tokens past its stop string in that step, which the
    text cut at the stop string drops. A prompt's first step reads the whole prompt, and checks no
    draft (its positions would not be the bits of the prompt's own step). ``speculation`` counts what
    the drafts did. ``judge``: what a row keeps of its draft (greedy's rule; speculative sampling's,
    decode/speculative_sampling.py, with ``normalised``); ``plain_first``: the first step is a plain
    one even after prompts of one token (speculative sampling: whether a row drafts then must not
    depend on how wide its batchmates' prompts are)."""
    counts = Speculation()  # this search's (added to ``speculation`` at its end)
    N, device = tokens.size(0), tokens.device
    found: list[list[int]] = [[] for _ in range(N)]
    rows = list(range(N))  # the rows still searched, in their order in the batch
    written: list[list[int]] = [[] for _ in range(N)]  # each row's tokens so far
    paces = [Pace() for _ in range(N)]  # each row's draft lengths
    bounds = limits.tolist()
    prompted = tokens.size(1) > 1 or plain_first  # the first step reads a prompt: a plain step
    while rows:
        # a draft may fill a row's room but for the model's own token after it
        drafting = len(rows) <= most_rows and not prompted
        lengths = [paces[r].next(bounds[r] - len(written[r]) - 1) if drafting else 0 for r in rows]
        prompted = False
        proposals = drafts.propose(rows, written, lengths, tokens)
        step = check(
            decoding, tokens, proposals, [len(written[r]) for r in rows], [bounds[r] for r in rows], specials,
            normalised=normalised, judge=judge, rows=rows,
        )  # fmt: skip
        ended = []
        for r, proposal, new, taken in zip(rows, proposals, step.new, step.taken, strict=True):
            written[r] += new
            counts.proposed, counts.taken = counts.proposed + len(proposal), counts.taken + taken
            counts.generated += len(new)
            paces[r].heard(len(proposal), taken)
            done = new[-1] == specials.eos or len(written[r]) >= bounds[r]
            ended.append(done)
            if done:
                found[r] = [t for t in written[r] if t != specials.eos]
        if observe is not None:
            _stopped(observe, written, rows, ended, found, specials)
        counts.steps += len(rows)
        drafts.checked(step.kept)
        tokens = step.tokens
        if any(ended):
            going = staying(ended)
            rows = [rows[i] for i in going]
            if rows:
                index = torch.tensor(going, dtype=torch.long, device=device)
                tokens = tokens[index][:, decoding.keep(index) or 0 :]
                drafts.keep(index)
    if speculation is not None:
        speculation.add(counts)
    return found


@dataclass
class Checked:
    """What a step that checked drafts (:func:`check`) gave each of its rows."""

    new: list[list[int]]  # the drafted tokens the model took, then its own choice (none after </s>)
    taken: list[int]  # how many drafted tokens the model took
    tokens: Tensor  # (n, t'): the tokens after the step, each row's new ones last (padding before them)

    @property
    def kept(self) -> Tensor:
        """``(n,)``: the positions each row's cache kept of those it checked (its last token, then the
        drafted tokens it took; 1 after a plain step)."""
        return torch.tensor([len(new) for new in self.new], device=self.tokens.device)


def check(
    decoding: Checking,
    tokens: Tensor,
    proposals: list[list[int]],
    steps: list[int],
    bounds: list[int],
    specials: SpecialIds,
    *,
    normalised: bool,
    judge: Judge,
    rows: list[int],
) -> Checked:
    """One step of speculative search (:func:`speculative_search`, a server's running batch) after
    ``tokens (n, t)``: the model's logits after each row's last token and after each token of its
    proposal (a plain step where nobody proposes), what ``judge`` keeps of each proposal (``rows``: the
    rows' numbers, which ``judge`` is told), and the caches rewound past the refused tokens. Row i has
    generated ``steps[i]`` tokens within its bound ``bounds[i]``, at which only ``</s>`` may follow."""
    device, d = tokens.device, max(map(len, proposals))
    if d:
        drafted = [p + [specials.pad] * (d - len(p)) for p in proposals]
        checked = torch.cat([tokens, torch.tensor(drafted, device=device)], dim=1)  # (n, t + d)
        logits = decoding.checked_logits(checked, d + 1)  # (n, d + 1, V)
    else:  # no row drafts: a plain step
        logits = decoding.next_logits(tokens)[:, None]  # (n, 1, V)
    # position j of row i is its step steps[i] + j: at its bound, only </s> may follow
    at = torch.tensor(steps, device=device)[:, None] + torch.arange(d + 1, device=device)  # (n, d + 1)
    at_limit = at + 1 >= torch.tensor(bounds, device=device)[:, None]
    V = logits.size(-1)
    flat = logits.view(-1, V)
    flat = only_allowed(log_probs_of(flat) if normalised else flat, at_limit.view(-1), specials)
    judged = judge(flat.view(-1, d + 1, V), rows, proposals)  # each row's kept draft, then the model's
    new = [ids[: ids.index(specials.eos) + 1] if specials.eos in ids else ids for ids in judged]
    step = Checked(new, [len(ids) - 1 for ids in judged], tokens)
    # each row's cache keeps the token it was given and the drafted ones it took; its tokens, those
    # and its own choice after them
    kept = step.kept
    if d:
        decoding.rewind(kept, d + 1)
        tokens = realigned(checked, tokens.size(1) + kept - 1, 1, specials.pad)
    chosen = torch.tensor([ids[-1] for ids in new], device=device)[:, None]
    step.tokens = torch.cat([tokens, chosen], 1)
    return step


def _stopped(
    observe: Callable[[Tensor], Tensor | None],
    written: list[list[int]],
    rows: list[int],
    ended: list[bool],
    found: list[list[int]],
    specials: SpecialIds,
) -> None:
    """Tell ``observe`` every row's tokens so far, ``(N, steps)`` padded after each row's (as ``extend``
    tells it), and end the rows still searched that it ends: ``ended[i]`` of row ``rows[i]``, and its
    tokens found."""
    width = max(map(len, written))
    generated = torch.tensor([ids + [specials.pad] * (width - len(ids)) for ids in written])
    stops = observe(generated)
    if stops is None:
        return
    for i, r in enumerate(rows):
        if not ended[i] and bool(stops[r]):
            ended[i] = True
            found[r] = [t for t in written[r] if t != specials.eos]
