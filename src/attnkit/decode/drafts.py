"""Where speculative decoding's drafts come from (decode/speculative.py checks them).

- :class:`SourceDrafts` (``decode.speculative=source``): each row's source, copied where the last
  tokens written occur in it (prompt lookup decoding, Saxena, 2023). Free to make; right where the
  output copies the input (dates, names and numbers, summaries with the copy mechanism).
- :class:`ContextDrafts` (``decode.speculative=source`` for a decoder-only model): the prompt and the
  text written so far, looked up alike.
- :class:`ShallowDrafts` (``decode.speculative=shallow``): a one-layer draft decoder (models/draft.py,
  a translation model's or a GPT's), or a smaller model of another checkpoint (``decode.speculative=
  PATH``, loading.py's ``draft_model``), that guesses the model's next tokens a step at a time, with a KV
  cache of its own kept in step with the model's: it drafts from the model's tokens, and after each
  check forgets the positions of the tokens the model did not take, as the model's cache does.

A draft is a guess: it never changes the output, only how many steps the search takes.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from attnkit.attention.invariance import each_query_alone
from attnkit.data.tokenizer import SpecialIds
from attnkit.decode.sampling import Generators, distribution
from attnkit.decode.search import log_probs_of, never_generated
from attnkit.errors import AttnkitError
from attnkit.models.decoding import Seq2SeqDecoding

# a draft decoder's row stops drafting after a guess it gives less than this probability (HF's assisted
# generation stops its assistant's drafts at 0.4 too): a doubtful guess is likely refused, and each
# guess drafted costs a step of the draft
CONFIDENT = 0.4
# the longest run of last tokens looked up in the source, then shorter runs down to the shortest (one
# token matched too often by chance: a translation's "a" or "." drafted what followed them in the source)
LONGEST_MATCH, SHORTEST_MATCH = 3, 2
# a vocabulary of at most this many entries holds characters (or bytes): a run of two or three of them
# matches by chance, so a decoder's context drafts look up runs of 6 down to 3 of them (a character-level
# tiny Shakespeare GPT, greedy, 30 prompts: 1.28x plain greedy's tokens/s, where runs of 3 down to 2 gave
# 1.11x; bench/speculative.py)
CHARACTERS, CHARACTER_MATCH = 256, (6, 3)


def require_draft(model: object, speculative: str, otherwise: str) -> None:
    """A one-line error where ``decode.speculative`` asks for ``model``'s draft (``shallow``: its draft
    decoder; a checkpoint's folder: that model, loaded with it) and it has none; ``otherwise``: what
    else the user may do."""
    if speculative in ("none", "source") or getattr(model, "draft", None) is not None:
        return
    if speculative == "shallow":
        raise AttnkitError(
            "decode.speculative=shallow needs the model's draft decoder, and this model has none (make "
            f"one with: attnkit distill-draft --ckpt RUN{otherwise})"
        )
    raise AttnkitError(
        f"decode.speculative={speculative} needs that checkpoint's model as this model's draft, and this "
        "model has none (attnkit.loading.load_for_inference loads it with the model)"
    )


class Drafts(Protocol):
    """What proposes drafts to speculative search (greedy or sampling), and hears what became of them."""

    def propose(
        self, rows: list[int], written: list[list[int]], lengths: list[int], tokens: Tensor
    ) -> list[list[int]]:
        """For each row still searched (``rows``, by their numbers, in their order in ``tokens (n, t)``,
        the tokens so far with ``<s>`` first), up to ``lengths[i]`` tokens to follow ``written[r]``
        (its generated tokens so far), never ``</s>``."""
        ...

    def drawn_from(self, index: int) -> Tensor | None:
        """The distributions ``(d, V)`` the ``index``-th row's last proposal (of ``d`` tokens) was drawn
        from, for speculative sampling; None where it was proposed for certain."""
        ...

    def checked(self, kept: Tensor) -> None:
        """After a step: row i kept ``kept[i]`` of the positions it checked (its last token and the
        drafted tokens the model took; 1 after a plain step)."""
        ...

    def keep(self, index: Tensor) -> None:
        """Only rows ``index`` go on (the others have ended)."""
        ...


class SourceDrafts:
    """Drafts copied from each row's source (prompt lookup): the tokens that follow, in the source, the
    first occurrence of the longest run (``longest`` tokens down to ``shortest``: :data:`LONGEST_MATCH`,
    :data:`SHORTEST_MATCH`) of the row's last tokens
    (nothing before the first token is written). ``sources``: each row's ids without ``</s>`` (a
    draft that ends a row saves nothing: the step would choose ``</s>`` on its own) or padding, by
    the row's number."""

    def __init__(
        self, sources: list[list[int]], longest: int = LONGEST_MATCH, shortest: int = SHORTEST_MATCH
    ) -> None:
        self.sources, self.longest, self.shortest = sources, longest, shortest

    def propose(
        self, rows: list[int], written: list[list[int]], lengths: list[int], tokens: Tensor
    ) -> list[list[int]]:
        return [self.follow(r, written[r], length) for r, length in zip(rows, lengths, strict=True)]

    def follow(self, row: int, written: list[int], length: int) -> list[int]:
        """Up to ``length`` tokens to follow ``written`` (row ``row``'s generated tokens so far)."""
        source = self.sources[row]
        if length <= 0:
            return []
        for n in range(min(self.longest, len(written)), self.shortest - 1, -1):
            found = _after(source, written[-n:], range(len(source) - n), length)  # the first match
            if found is not None:
                return found
        return []

    def drawn_from(self, index: int) -> Tensor | None:
        return None  # copied: proposed for certain

    def checked(self, kept: Tensor) -> None:
        pass  # a source is the same at every step

    def keep(self, index: Tensor) -> None:
        pass  # rows are looked up by their numbers


class ContextDrafts(SourceDrafts):
    """A decoder's drafts copied from each row's context, its prompt and what it has written so far
    (prompt lookup as HF's ``generate`` does it, over the whole input): the tokens that follow the
    latest earlier occurrence of the longest run (up to ``longest`` tokens, down to ``shortest``) of
    the context's last tokens. A continuation repeats its prompt's names and phrases, and a greedy one
    its own lines. ``sources``: each row's prompt ids, by the row's number."""

    @classmethod
    def for_vocabulary(cls, sources: list[list[int]], vocab_size: int) -> ContextDrafts:
        """Drafts from ``sources`` matching runs as long as a vocabulary of ``vocab_size`` needs (see
        :data:`CHARACTERS`)."""
        return cls(sources, *CHARACTER_MATCH) if vocab_size <= CHARACTERS else cls(sources)

    def follow(self, row: int, written: list[int], length: int) -> list[int]:
        if length <= 0:
            return []
        context = self.sources[row] + written
        for n in range(min(self.longest, len(context) - 1), self.shortest - 1, -1):
            found = _after(context, context[-n:], range(len(context) - n - 1, -1, -1), length)  # the latest
            if found is not None:
                return found
        return []


class ShallowDrafts:
    """Drafts of a shallow draft decoder (models/draft.py) stepped by ``draft`` (a ``Seq2SeqDecoding``
    of it over the model's memory, or a GPT draft's ``CausalDecoding`` over the same left-padded
    prompts): its greedy choices, a step at a time.

    A row drafts up to its length, and stops at ``</s>`` or after a guess the draft gives less than
    :data:`CONFIDENT` probability; the draft stops stepping when every row has stopped. With
    ``sampling`` (speculative sampling, decode/speculative_sampling.py), each guess is drawn from the
    draft's distribution under the same settings as the model's, row r from the generator of its own,
    and :meth:`drawn_from` gives those distributions.

    Its cache follows the model's. Drafting a row's next ``d`` tokens feeds the draft the row's
    tokens not yet in its cache (the last one; more after plain steps, which the draft sits out) and
    then its own first ``d - 1`` guesses: the model's check then holds those positions and one more,
    the last guess. After the check each row keeps the positions of its last token and the guesses
    the model took. Where every row took them all, the draft reads its last guesses with its next
    drafting (as it reads the tokens of the plain steps it sat out); where only some did, it reads
    them now (one more step), so that every row keeps the model's positions."""

    def __init__(
        self, draft: Seq2SeqDecoding, specials: SpecialIds, sampling: DraftSampling | None = None
    ) -> None:
        self.draft, self.specials, self.sampling = draft, specials, sampling
        self.never = never_generated(specials)
        self.drawn: Tensor | None = None  # (n, steps, V): the distributions of the last guesses (sampling)
        self.fed: Tensor | None = None  # (n, t + d - 1): the tokens and guesses of the last drafting
        self.last: Tensor | None = None  # (n, 1): each row's last guess, not yet read by the draft
        self.drafted = 0  # how many positions the last drafting added to the draft's cache

    def propose(
        self, rows: list[int], written: list[list[int]], lengths: list[int], tokens: Tensor
    ) -> list[list[int]]:
        d = max(lengths)
        if not d:
            return [[] for _ in rows]
        x = tokens  # (n, t)
        guesses = []
        wanted = torch.tensor(lengths, device=tokens.device)  # (n,)
        going = wanted > 0  # (n,): the rows still drafting
        counts = torch.zeros_like(wanted)  # (n,): each row's guesses so far
        drawn = []
        for j in range(d):
            with each_query_alone() if self.sampling is not None else nullcontext():
                # (sampling: a row's guesses are drawn from the bits of one-token steps however many
                # tokens it catches up on, a number its batchmates' drafts decide)
                logits = self.draft.next_logits(x)  # (n, V)
            logits[:, self.never] = float("-inf")  # as the model's choice rules them out
            if self.sampling is None:
                confidence, guess = logits.softmax(-1).max(-1)  # (n,) each
            else:
                probs = self.sampling.distribution(logits)  # (n, V)
                guess = self.sampling.draw(probs, rows, going.tolist())  # (n,)
                confidence = probs.gather(1, guess[:, None])[:, 0]
                drawn.append(probs)
            guesses.append(guess[:, None])
            counts += going
            # a row stops at its length, at </s>, or after a guess the draft doubts
            going &= (j + 1 < wanted) & (guess != self.specials.eos) & (confidence >= CONFIDENT)
            if not bool(going.any()):
                break
            x = torch.cat([x, guess[:, None]], 1)
        # the draft's cache now holds as many positions past the model's as it took steps: the last
        # token and the guesses but the last
        self.fed, self.last, self.drafted = x, guesses[-1], len(guesses)
        self.drawn = torch.stack(drawn, 1) if drawn else None
        proposals = torch.cat(guesses, 1).tolist()  # (n, steps)
        eos = self.specials.eos
        return [_before_end(p[:count], eos) for p, count in zip(proposals, counts.tolist(), strict=True)]

    def drawn_from(self, index: int) -> Tensor | None:
        return None if self.drawn is None else self.drawn[index]

    def checked(self, kept: Tensor) -> None:
        if self.fed is None or self.last is None:  # nothing drafted: the draft sat the step out
            return
        took_all = kept > self.drafted  # (n,): rows that took every guess, the last one unread
        if bool(took_all.all()):  # the draft reads it with its next drafting, as after a plain step
            kept = kept - 1
        elif bool(took_all.any()):  # the draft reads it now, so that every row keeps the model's positions
            self.draft.next_logits(torch.cat([self.fed, self.last], 1))
            self.drafted += 1
        self.draft.rewind(kept, self.drafted)
        self.fed = self.last = None

    def keep(self, index: Tensor) -> None:
        self.draft.keep(index)


@dataclass(frozen=True)
class DraftSampling:
    """How a draft decoder samples its guesses for speculative sampling: as the model samples
    (``decode/sampling.py``'s :func:`~attnkit.decode.sampling.distribution`), row r drawing from
    ``generators[r]``."""

    generators: Generators
    temperature: float
    top_k: int
    top_p: float

    def distribution(self, scores: Tensor, normalised: bool = False) -> Tensor:
        """``(n, V)`` logits (log-probabilities where ``normalised``) -> the ``(n, V)`` probabilities a
        token is drawn from."""
        log_probs = scores if normalised else log_probs_of(scores)
        return distribution(log_probs, self.temperature, self.top_k, self.top_p)

    def draw(self, probs: Tensor, rows: list[int], going: list[bool]) -> Tensor:
        """One guess per row from ``probs (n, V)``, drawn where the row still drafts (``going``) from
        its own generator (the others draw nothing: their guess is ignored)."""
        picks = [
            torch.multinomial(p, 1, generator=self.generators[r]) if on else p.argmax().view(1)
            for p, r, on in zip(probs, rows, going, strict=True)
        ]
        return torch.cat(picks)


def _after(text: list[int], run: list[int], places: range, length: int) -> list[int] | None:
    """Up to ``length`` tokens that follow ``run`` in ``text`` at the first of ``places`` (where a match
    has at least one token after it) that holds it; None where none does."""
    n = len(run)
    for i in places:
        if text[i : i + n] == run:
            return text[i + n : i + n + length]
    return None


def _before_end(tokens: list[int], eos: int) -> list[int]:
    """``tokens`` up to the first ``</s>`` (a draft that ends the row saves nothing: see SourceDrafts)."""
    return tokens[: tokens.index(eos)] if eos in tokens else tokens
