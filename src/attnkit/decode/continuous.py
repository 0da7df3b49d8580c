"""Continuous batching: running batches of translations (:class:`RunningTranslations`) and of a
decoder's continuations (:class:`RunningGenerations`) that sources and prompts join at any step and
leave as soon as they are done.

``translate`` searches a batch to its end: the batch is as slow as its longest sentence, and a
sentence that comes meanwhile waits for all of it. A server does better with one running batch
(:class:`RunningTranslations`) that it advances a step at a time (:meth:`~RunningTranslations.iterate`):
at every step, the sources that came since the last one are encoded and take their first step (as
their own small batch), then join the running rows (``Beams.merge``, which pads the shorter KV
caches on the left and lets each row go on at its own position, and writes the newcomers' memories and
cross-attention keys behind the running sources', models/row_buffers.py); every running source takes one
step; those whose search is over leave at once, and their rows are not decoded again (once the widest
sources have left, the others' padding is cut: ``Seq2SeqDecoding.keep``).

Each source gets what ``translate`` gives it alone, whatever shares its steps: it is cut, bounded
and searched with the same settings and the same code (``starts``, ``beams.Beams``), its rows see only their
own keys (the padding is masked) and its scores are its own. Where compiled steps are had
(``decode.steps``), the steps are the compiled ones, as ``translate`` takes them (decode/compiled.py:
newcomers' keys join the history in slots of their own); with ``auto``, the running batch looks every
second whether they have been built meanwhile (by the server, serve/building.py), and the sources that
join from then on take them, in running batches of their own, while those that joined before finish
with the model's own steps. Sources with other settings (a beam of 1 and one of 5, or another
``n_best``) run in running batches of their own, stepped one after the other. With compiled steps,
the first step (which encodes the newcomers) and the steps after it sum each source's keys in the same
order at any wider padded width (docs/invariance.md), so newcomers of every width take their first
step together and share one running batch. A greedy source (a beam of one) searched alone in its
running batch checks drafts (``decode.speculative``: its own tokens, or the guesses of the model's
draft decoder or another checkpoint's model, with a cache of the source's own), as ``translate``
checks them, but choosing and scoring each token as beam search of one beam does
(:class:`~attnkit.decode.speculative.OneBeam`): the same translation and score, several tokens a step
where the drafts are right.

Prompts go the same way through ``search.Extension`` (``generate``'s steps): left-padded as
``generate`` pads them, each sampled from its own generator seeded with its seed, its text streamed
and cut at its stop strings as ``generate`` does (``TextStream``), one running batch per sampling
setting. A greedy prompt continued alone in its running batch checks drafts (``decode.speculative``:
copied from its context, or guessed by the model's draft decoder or another checkpoint's model, with a
cache of the row's own that is made again whenever the row's padding changes), as ``generate`` checks
them: the same text, several tokens a step where the drafts are right.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, cast

import torch
from torch import Tensor

from attnkit.config import DecodeConfig
from attnkit.cpu.compiled.build import CHECK_STEP, FIRST_STEP
from attnkit.cpu.compiled.steps import all_built
from attnkit.data.tokenizer import SpecialIds, Tokenizer
from attnkit.decode.beams import Beams
from attnkit.decode.compiled import CompiledDecoding
from attnkit.decode.drafts import ContextDrafts, Drafts, ShallowDrafts, SourceDrafts
from attnkit.decode.generate import TextStream
from attnkit.decode.search import BeamSettings, Extension, Hypothesis, Search, Translation
from attnkit.decode.speculative import Checking, OneBeam, Pace, check, economy, greedy_judge
from attnkit.decode.starts import (
    SourceDecoding,
    encode_prompts,
    encode_sources,
    prompt_sampler,
    ready_prompts,
    ready_sources,
    serving,
    source_decoding,
)
from attnkit.decode.translate import translation
from attnkit.models.decoder_only import DecoderModel
from attnkit.models.decoding import CausalDecoding, Seq2SeqDecoding
from attnkit.models.draft import ShallowCausalDraft
from attnkit.models.seq2seq import EncoderDecoder

# how often a running batch decoding with the model's own steps looks whether compiled ones are built
LOOK_AGAIN_S = 1.0
# what a caller calls each source it hands in, and hears back when its translation is done
Key = Hashable
# a source's n_best translations, best first (translate's n_best output)
Translations = list[Translation]


@dataclass
class RunningTranslations:
    """The running batches of one model, one per search setting (beam and ``n_best``): see the module
    docstring."""

    model: EncoderDecoder
    tokenizer: Tokenizer
    decode: DecodeConfig
    device: torch.device | str = "cpu"
    # each setting's batch, and whether its steps are compiled ones (decode.steps=auto: sources that
    # join once the compiled steps are built take them, in a batch of their own, while those that
    # joined before finish with the model's own)
    running: dict[tuple[BeamSettings, bool], Beams] = field(default_factory=dict)
    # how sources are decoded, by beam: compiled steps where they are had (as translate decodes a
    # source alone), else the model's own; and when each was chosen
    decodings: dict[int, SourceDecoding] = field(default_factory=dict)
    chosen: dict[int, float] = field(default_factory=dict)
    # the greedy sources that check drafts when alone in their running batch (decode.speculative)
    drafting: dict[Key, _Drafted] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """The model in eval mode, with attnkit's kernels, as ``translate`` searches it."""
        serving(self.model)

    @property
    def rows(self) -> int:
        """Rows decoded at the next step: every running source's beams."""
        return sum(len(beams.sources) * beams.beams for beams in self.running.values())

    @property
    def sources(self) -> int:
        """Sources being searched."""
        return sum(len(beams.sources) for beams in self.running.values())

    @torch.no_grad()
    def iterate(
        self, joining: list[tuple[Key, str, BeamSettings]], leaving: set[Key] = frozenset()
    ) -> list[tuple[Key, Translations]]:
        """One step: the sources ``leaving`` (nobody waits for them) leave; ``joining`` (each source's
        key, text and :class:`BeamSettings`) join after their first step; every running source takes one
        step. Returns the sources whose translations are done, with them (an empty text at once, with
        no translations, as ``translate`` gives it)."""
        if leaving:
            self._leave(set(leaving))
        done: list[tuple[Key, list[Hypothesis]]] = []
        texts = [text for _, text, _ in joining if text.strip()]
        encoded = iter(encode_sources(self.tokenizer, texts, self.model.config.max_len))
        by_first_step: dict[tuple[BeamSettings, SourceDecoding], list[tuple[Key, list[int]]]] = {}
        for key, text, settings in joining:
            if text.strip():
                how, ids = self._decoding(settings.beam), next(encoded)
                by_first_step.setdefault((settings, how), []).append((key, ids))
                if settings.beam == 1 and self.decode.speculative != "none":
                    self.drafting[key] = _Drafted(ids, how)
            else:
                done.append((key, []))
        for (settings, how), sources in by_first_step.items():
            done += self._join(settings, how, sources)
        for batch in list(self.running):
            beams = self.running[batch]
            done += self._drafted(beams) if self._checks_drafts(beams) else beams.step()
            if not beams.sources:
                del self.running[batch]
        for key, _ in done:
            self.drafting.pop(key, None)
        return [(key, [translation(self.tokenizer, h) for h in found]) for key, found in done]

    def _join(
        self, settings: BeamSettings, how: SourceDecoding, sources: list[tuple[Key, list[int]]]
    ) -> list[tuple[Key, list[Hypothesis]]]:
        """Take the first step of ``sources`` (their keys and ids) as a batch of their own, decoded
        ``how``, and merge those still searched into the running batch of those settings and steps;
        returns those already done."""
        model, specials = self.model, self.tokenizer.specials
        search = Search.of(
            self.decode, beam_size=settings.beam, n_best=settings.n_best, max_output_len=model.config.max_len
        )
        ids = [ids for _, ids in sources]
        ready = ready_sources(model, ids, how, specials, search, self.device)
        keys = [key for key, _ in sources]
        joining = Beams(ready.decoding, ready.tokens, ready.limits, specials, search, keys)
        done = joining.step()  # the first step, on one row per source; then K beams each
        batch = (settings, how.compiled)
        if joining.sources:
            if batch in self.running:
                self.running[batch].merge(joining)
            else:
                self.running[batch] = joining
        return done

    def _decoding(self, beam: int) -> SourceDecoding:
        """How sources of ``beam`` are decoded now: the model's own steps, or compiled ones without the
        check of drafts that greedy sources would take, are chosen again at most every
        :data:`LOOK_AGAIN_S` (``decode.steps=auto``: a server builds the compiled ones meanwhile)."""
        now, how = time.monotonic(), self.decodings.get(beam)
        if how is not None and self.decode.steps != "auto":
            return how
        if how is not None and how.compiled and (how.checks or not self._drafted_steps(beam)):
            return how
        if how is None or now - self.chosen.get(beam, now) >= LOOK_AGAIN_S:
            drafted = self._drafted_steps(beam)
            how = self.decodings[beam] = source_decoding(
                self.model, self.decode, beam, self.device, self.tokenizer.specials, drafted=drafted
            )
            self.chosen[beam] = now
        return how

    def _drafted_steps(self, beam: int) -> bool:
        """Whether sources of ``beam`` take steps that check drafts: greedy search with drafts, where
        the steps are the model's own or compiled ones built with their check step. With ``auto``, a
        running batch builds nothing: where the plain compiled steps are built and the check step is
        not (yet), its greedy sources take the plain steps, without drafts."""
        if beam != 1 or self.decode.speculative == "none":
            return False
        if self.decode.steps != "auto" or all_built(self.model, [CHECK_STEP]):
            return True
        return not all_built(self.model, [FIRST_STEP, 1])

    def _leave(self, keys: set[Key]) -> None:
        for batch in list(self.running):
            self.running[batch].leave(keys)
            if not self.running[batch].sources:
                del self.running[batch]
        for key in keys:
            self.drafting.pop(key, None)

    def _checks_drafts(self, beams: Beams) -> bool:
        """Whether ``beams`` checks drafts at its next step: one greedy source with drafts searched alone,
        by steps that check with their own bits (``checks_exactly``; a decoding that cannot check, an
        RNN's, never does), with its drafts to hand (a draft model's decoding, where it needs one)."""
        drafted = self.drafting.get(beams.sources[0]) if len(beams.sources) == 1 else None
        return (
            drafted is not None
            and beams.beams == 1
            and getattr(beams.decoding, "checks_exactly", False)
            and (self.decode.speculative == "source" or drafted.how.draft is not None)
        )

    def _drafted(self, beams: Beams) -> list[tuple[Key, list[Hypothesis]]]:
        """The next step of ``beams``' one greedy source: one that checks a draft (:meth:`_checked`) or a
        plain one, as the running batch's :class:`~attnkit.decode.speculative.Economy` chooses (the
        same translation either way)."""
        steps = "compiled" if isinstance(beams.decoding, CompiledDecoding) else "eager"
        kind = "source" if self.decode.speculative == "source" else "a draft model"
        paying = economy(self.model, f"{kind}, a running batch's {steps} steps")
        step = paying.searched(lambda: self._checked(beams), lambda: (beams.step(), 1), lambda s: s[1])
        return step[0]

    def _checked(self, beams: Beams) -> tuple[list[tuple[Key, list[Hypothesis]]], int]:
        """A step of ``beams``' one greedy source that checks a draft: its drafted tokens that beam search
        of one beam would choose (:class:`OneBeam`: the same choice and score), then its own choice;
        the source's translation where it ends, and the tokens it generated."""
        (key,) = beams.sources
        drafted, specials = self.drafting[key], self.tokenizer.specials
        steps, limit = int(beams.steps[0]), int(beams.limits[0])
        own = beams.tokens[:, beams.tokens.size(1) - steps - 1 :]  # (1, steps + 1): <s>, its tokens
        written = own[0, 1:].tolist()
        length = drafted.pace.next(limit - steps - 1)  # room for the model's own token after it
        drafts = drafted.drafts(beams.decoding, self.decode.speculative, specials)
        (proposal,) = drafts.propose([0], [written], [length], own)
        judge = OneBeam(beams.scores[:, 0], specials.eos)
        step = check(cast(Checking, beams.decoding), beams.tokens, [proposal], [steps], [limit], specials,
                     normalised=True, judge=judge, rows=[0])  # fmt: skip
        drafts.checked(step.kept)  # its cache rewound as the model's
        (new,) = step.new
        drafted.pace.heard(len(proposal), step.taken[0])
        beams.tokens, beams.scores, beams.steps = step.tokens, judge.scores[:, None], beams.steps + len(new)
        if new[-1] != specials.eos:  # (at its bound only </s> may follow)
            return [], len(new)
        beams.sources, beams.finished = [], []
        return [(key, [judge.hypothesis(0, written + new[:-1], beams.search)])], len(new)


class Continuing(Protocol):
    """A prompt to continue in a running batch: its text, its generator's seed, and ``sink`` (or None),
    which hears its text piece by piece as it grows."""

    text: str
    seed: int
    sink: Callable[[str], None] | None


@dataclass
class RunningGenerations:
    """A decoder's running batches, one per sampling setting (``decode_for(settings)``: the decoding
    settings of a request's ``settings``): prompts join them at any step and leave them when done, each
    continued as ``generate`` continues it alone (its own generator, seeded with its seed; its stop
    strings; its text streamed to its sink)."""

    model: DecoderModel
    tokenizer: Tokenizer
    decode_for: Callable[[Hashable], DecodeConfig]
    device: torch.device | str = "cpu"
    running: dict[Hashable, Extension] = field(default_factory=dict)  # settings -> its batch
    continuing: dict[int, _Continued] = field(default_factory=dict)  # each row, by its number
    numbers: Iterator[int] = field(default_factory=itertools.count)  # each row's, never used again
    decodes: dict[Hashable, DecodeConfig] = field(default_factory=dict)  # decode_for's, once per setting

    def __post_init__(self) -> None:
        """The model in eval mode, with attnkit's kernels, as ``generate`` continues a prompt."""
        serving(self.model)

    @property
    def sources(self) -> int:
        """Prompts being continued."""
        return len(self.continuing)

    @property
    def rows(self) -> int:
        """Rows decoded at the next step: one per prompt."""
        return len(self.continuing)

    @torch.no_grad()
    def iterate(
        self, joining: list[tuple[Key, Continuing, Hashable]], leaving: set[Key] = frozenset()
    ) -> list[tuple[Key, str]]:
        """One step (see :meth:`RunningTranslations.iterate`): returns the prompts whose continuations
        are done, with them."""
        if leaving:
            gone = {row for row, continued in self.continuing.items() if continued.key in leaving}
            for settings in list(self.running):
                self.running[settings].leave(gone)
                if not len(self.running[settings].rows):
                    del self.running[settings]
            for row in gone:
                del self.continuing[row]
        by_settings: dict[Hashable, list[tuple[Key, Continuing]]] = {}
        for key, prompt, settings in joining:
            by_settings.setdefault(settings, []).append((key, prompt))
        done = []
        for settings, prompts in by_settings.items():
            done += self._step(settings, self._joined(settings, prompts), merge=True)
        for settings in list(self.running):
            done += self._step(settings, self.running[settings])
        return done

    def _joined(self, settings: Hashable, prompts: list[tuple[Key, Continuing]]) -> Extension:
        """The prompts' rows, as ``generate`` makes a batch of them (left-padded, each its generator)."""
        decode, pad_id = self._decode(settings), self.tokenizer.specials.pad
        encoded = encode_prompts(
            self.tokenizer, [prompt.text for _, prompt in prompts], self.model.config.max_len
        )
        ready = ready_prompts(self.model, encoded, pad_id, decode, self.device)
        numbers = [next(self.numbers) for _ in prompts]
        for number, (key, prompt), ids in zip(numbers, prompts, encoded, strict=True):
            generator = torch.Generator(self.device).manual_seed(prompt.seed)
            on_text = None if prompt.sink is None else (lambda _, text, sink=prompt.sink: sink(text))
            stream = TextStream(self.tokenizer, decode.stop, [0], on_text)
            self.continuing[number] = _Continued(key, generator, stream, ids)
        choose = prompt_sampler(_Generators(self.continuing), decode)
        rows = torch.tensor(numbers, device=self.device)
        return Extension(ready.decoding, ready.tokens, ready.limits, self.tokenizer.specials, choose, rows)

    def _step(self, settings: Hashable, extension: Extension, merge: bool = False) -> list[tuple[Key, str]]:
        """One step of ``extension`` (newcomers: their first, then they join the running batch of their
        settings); returns the rows done, with their text. A prompt continued alone in its running
        batch, greedily, checks drafts where they pay (``decode.speculative``: :meth:`_checked`)."""
        decode = self._decode(settings)
        drafting = decode.speculative != "none" and not decode.temperature  # greedy, with drafts
        if drafting and not merge and len(extension.rows) == 1:
            kind = "source" if decode.speculative == "source" else "a draft model"
            paying = economy(self.model, f"{kind}, a running batch's steps")
            ended = paying.searched(
                lambda: self._checked(extension, decode.speculative == "source"),
                lambda: self._plain(extension),
                lambda step: step[1],
            )[0]
        else:
            ended = extension.step(self._observe)
        if merge and len(extension.rows):
            if settings in self.running:
                self.running[settings].merge(extension)
            else:
                self.running[settings] = extension
        elif not merge and not len(extension.rows):
            del self.running[settings]
        done = []
        for row, ids in ended:
            continued = self.continuing.pop(row)
            done.append((continued.key, continued.stream.finish(0, ids)))
        return done

    def _decode(self, settings: Hashable) -> DecodeConfig:
        """``decode_for(settings)``, made once (a running batch asks at every step) while few settings
        have been seen (requests choose theirs: those of the past are forgotten by the hundred)."""
        if settings not in self.decodes:
            if len(self.decodes) >= 100:
                self.decodes.clear()
            self.decodes[settings] = self.decode_for(settings)
        return self.decodes[settings]

    def _plain(self, extension: Extension) -> tuple[list[tuple[int, list[int]]], int]:
        """A plain step of ``extension``: the rows it ends, and the tokens it generated."""
        return extension.step(self._observe), len(extension.rows)

    def _checked(self, extension: Extension, copied: bool) -> tuple[list[tuple[int, list[int]]], int]:
        """A step of ``extension``'s one row that checks a draft, as greedy generation checks them alone
        (decode/speculative.py): the same tokens, several in one step where the draft is right; the
        rows it ends, and the tokens it generated. The draft is ``copied`` from the row's context (its
        prompt and text so far: ``ContextDrafts``), or guessed by the model's draft (:meth:`_guessing`)."""
        (row,) = extension.rows.tolist()
        continued, limit = self.continuing[row], int(extension.limits[0])
        written = continued.generated
        length = continued.pace.next(limit - len(written) - 1)  # room for the model's own token after it
        if copied:
            guessing = None
            drafts = ContextDrafts.for_vocabulary([continued.prompt], self.tokenizer.vocab_size)
            proposal = drafts.follow(0, written, length)
        else:
            guessing = self._guessing(continued, extension)
            (proposal,) = guessing.propose([row], [written], [length], extension.tokens)
        checking = cast(Checking, extension.decoding)
        step = check(checking, extension.tokens, [proposal], [len(written)], [limit], self.tokenizer.specials,
                     normalised=True, judge=greedy_judge, rows=[row])  # fmt: skip
        if guessing is not None:
            guessing.checked(step.kept)  # its cache rewound as the model's
        (new,) = step.new
        continued.pace.heard(len(proposal), step.taken[0])
        written += new
        ends = new[-1] == self.tokenizer.specials.eos or len(written) >= limit or continued.stopped()
        ended = extension.took(step.tokens, step.kept, torch.tensor([ends], device=step.tokens.device))
        return ended, len(new)

    def _guessing(self, continued: _Continued, extension: Extension) -> ShallowDrafts:
        """The guesses of the model's draft (its draft decoder, or another checkpoint's model) for
        ``continued``, alone in ``extension``, with a cache of the row's own. The cache holds the row's
        tokens as they are laid out in ``extension`` (its padding on the left); where that changed since
        (rows joined or left while it shared its steps), a new draft reads them all again."""
        layout = extension.tokens.size(1) - len(continued.generated)  # the prompt's columns, padding in
        if continued.guessing is None or continued.guessing[0] != layout:
            draft = cast(ShallowCausalDraft | DecoderModel, self.model.draft)
            valid = cast(CausalDecoding, extension.decoding).prompt_valid.clone()  # (1, P): its real tokens
            continued.guessing = layout, ShallowDrafts(draft.decoding(valid), self.tokenizer.specials)
        return continued.guessing[1]

    def _observe(self, next_token: Tensor, rows: Tensor) -> Tensor | None:
        """Each row's new token: its text streamed and checked for stop strings (``TextStream``)."""
        stops = []
        for token, row in zip(next_token.tolist(), rows.tolist(), strict=True):
            continued = self.continuing[row]
            continued.generated.append(token)
            stops.append(continued.stopped())
        return torch.tensor(stops, device=next_token.device)


@dataclass
class _Drafted:
    """A greedy source that checks drafts while alone in its running batch: its ids (``</s>`` last), how
    it is decoded, its drafts' lengths, and its drafts, made when first checked."""

    source: list[int]
    how: SourceDecoding
    pace: Pace = field(default_factory=Pace)
    made: Drafts | None = None

    def drafts(self, decoding: object, speculative: str, specials: SpecialIds) -> Drafts:
        """Its drafts: its own tokens, or the guesses of the model's draft (``how.draft``) over its source
        and memory as ``decoding`` holds them now (copied: the running batch's buffers are reused)."""
        if self.made is None:
            if speculative == "source":
                self.made = SourceDrafts([self.source[:-1]])
            else:  # (RunningTranslations._checks_drafts: how.draft is had)
                assert self.how.draft is not None
                held = cast(Seq2SeqDecoding, decoding)
                src, memory = held.src[:1].clone(), held.memory[:1].clone()  # (1, S), (1, S, d_model)
                self.made = ShallowDrafts(self.how.draft(src, memory), specials)
        return self.made


@dataclass
class _Continued:
    """A prompt a running batch continues: its caller's key, its generator, its text stream, its ids,
    its tokens so far, the lengths of its drafts (``decode.speculative``) and, while it is alone in its
    running batch, its draft model's guesses (with the layout of the tokens they follow)."""

    key: Key
    generator: torch.Generator
    stream: TextStream
    prompt: list[int]
    generated: list[int] = field(default_factory=list)
    pace: Pace = field(default_factory=Pace)
    guessing: tuple[int, ShallowDrafts] | None = None

    def stopped(self) -> bool:
        """Whether its text so far reached a stop string, or nobody wants it (its text streamed)."""
        stream = self.stream
        return bool(stream.observe(torch.tensor([self.generated]))[0]) if stream.watching else False


class _Generators:
    """Each row's generator by its number, as a sampler reads them (``generators[row]``)."""

    def __init__(self, continuing: dict[int, _Continued]) -> None:
        self.continuing = continuing

    def __getitem__(self, row: int) -> torch.Generator:
        return self.continuing[row].generator
