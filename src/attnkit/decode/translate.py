"""Text in, text out: tokenise, batch by length, search, restore the input order, detokenise."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, cast, overload

import torch

from attnkit.config import DecodeConfig
from attnkit.data.batching import length_batches
from attnkit.data.tokenizer import SpecialIds, Tokenizer
from attnkit.decode.beams import beam
from attnkit.decode.drafts import Drafts, ShallowDrafts, SourceDrafts, require_draft
from attnkit.decode.search import BeamSettings, Hypothesis, Search, Translation, argmax, extend
from attnkit.decode.speculative import Checking, OneBeam, Speculation, economy, speculative_search
from attnkit.decode.starts import SourceDecoding, encode_sources, ready_sources, searching, source_decoding
from attnkit.decode.streams import fill_by_batch, stream_count
from attnkit.models import device_of
from attnkit.models.decoding import Seq2SeqDecoding
from attnkit.models.seq2seq import EncoderDecoder


@dataclass
class Reporting:
    """What a long translation tells as it goes: ``warn`` hears once how many inputs were cut to fit,
    ``progress`` how many more lines are done, batch by batch; ``first_line`` is the number ``warn``
    gives ``texts[0]`` (the command line translates a large input a part at a time); ``speculation``
    counts what drafts did (``decode.speculative``)."""

    warn: Callable[[str], None] | None = None
    progress: Callable[[int], None] | None = None
    first_line: int = 1
    speculation: Speculation | None = None


@overload
def translate(
    model: EncoderDecoder,
    tokenizer: Tokenizer,
    texts: list[str],
    decode: DecodeConfig,
    *,
    n_best: Literal[0] = 0,
    beam_size: int | None = None,
    source_limit: int | None = None,
    reporting: Reporting | None = None,
) -> list[str]: ...


@overload
def translate(
    model: EncoderDecoder,
    tokenizer: Tokenizer,
    texts: list[str],
    decode: DecodeConfig,
    *,
    n_best: int,
    beam_size: int | None = None,
    source_limit: int | None = None,
    reporting: Reporting | None = None,
) -> list[list[Translation]]: ...


def translate(
    model: EncoderDecoder,
    tokenizer: Tokenizer,
    texts: list[str],
    decode: DecodeConfig,
    *,
    n_best: int = 0,
    beam_size: int | None = None,
    source_limit: int | None = None,
    reporting: Reporting | None = None,
) -> list[str] | list[list[Translation]]:
    """Translate ``texts``: each text's translation, or with ``n_best`` its ``n_best`` best translations
    and their scores (``log P / lp``, as beam search ranks them; see search.py) and token counts
    (:class:`~attnkit.decode.search.Translation`), best first, none for an empty line. ``beam_size`` 1
    is greedy search (with ``n_best`` 1, its translation scored), default ``decode.beam_size``;
    ``n_best`` may not exceed it. On a CPU the batches are searched
    ``decode.streams`` at a time (decode/streams.py). The texts go where the model is.

    An empty (or all-space) input line gives an empty output line without running the model. The model
    handles at most ``model.config.max_len`` positions: a longer source is cut to fit and no output is
    longer, so that one pathological line cannot stall its batch (``reporting.warn`` hears how many were
    cut). ``source_limit`` cuts sources shorter still, to the length the model was trained on (a
    summariser's ``data.max_source_len``: it has only ever read an email's beginning).
    """
    beam = BeamSettings(decode.beam_size if beam_size is None else beam_size, max(n_best, 1))
    search = Search.of(decode, beam_size=beam.beam, n_best=beam.n_best)
    found = _hypotheses(model, tokenizer, texts, decode, search, scored=n_best > 0,
                        source_limit=source_limit, reporting=reporting or Reporting())  # fmt: skip
    if n_best:
        return [[translation(tokenizer, h) for h in hypotheses] for hypotheses in found]
    return [tokenizer.decode(hypotheses[0].tokens) if hypotheses else "" for hypotheses in found]


def translation(tokenizer: Tokenizer, hypothesis: Hypothesis) -> Translation:
    """``hypothesis`` as its reader gets it: its ids decoded, its score, and how many they are (a
    hypothesis holds its generated ids without ``</s>``: beam search's, and greedy search's stripped)."""
    return Translation(tokenizer.decode(hypothesis.tokens), hypothesis.score, len(hypothesis.tokens))


def _hypotheses(
    model: EncoderDecoder,
    tokenizer: Tokenizer,
    texts: list[str],
    decode: DecodeConfig,
    search: Search,
    *,
    scored: bool,
    source_limit: int | None,
    reporting: Reporting,
) -> list[list[Hypothesis]]:
    """Each text's hypotheses, best first, by ``search`` (bounded by the model's positions), batched as
    ``decode`` says; a beam of one without ``scored`` is greedy search, whose hypotheses have no score."""
    specials, longest, device = tokenizer.specials, model.config.max_len, device_of(model)
    encoded = encode_sources(tokenizer, texts, longest, source_limit, reporting.warn, reporting.first_line)
    search = dataclasses.replace(search, max_output_len=longest)
    found: list[list[Hypothesis]] = [[] for _ in texts]
    todo = [i for i, text in enumerate(texts) if text.strip()]
    if reporting.progress is not None:
        reporting.progress(len(texts) - len(todo))  # the empty lines
    if not todo:
        return found
    one_beam = search.beam_size == 1  # greedy search, or with ``scored`` a beam of one
    drafted = one_beam and decode.speculative != "none"  # checks drafts (compiled steps or the model's)
    require_draft(model, decode.speculative, "")
    if decode.speculative != "none" and not one_beam and reporting.warn is not None:
        reporting.warn(
            f"decode.speculative={decode.speculative} checks drafts in a search of one beam alone (greedy "
            f"search, or a beam of 1 scored); this search (beam {search.beam_size}) takes none"
        )
    warn = reporting.warn
    how = source_decoding(model, decode, search.beam_size, device, specials, warn, len(todo), drafted)
    batches = length_batches(todo, [len(ids) for ids in encoded], decode.batch_size)
    steps = "compiled" if how.compiled else "eager"
    scoring = ", scored" if scored else ""
    paying = economy(model, f"{decode.speculative}, {steps} steps{scoring}") if drafted else None

    @torch.no_grad()  # here, in the thread that runs the batch: gradient mode is per thread
    def searched(chunk: list[int]) -> list[list[Hypothesis]]:
        sources = [encoded[i] for i in chunk]
        ready = ready_sources(model, sources, how, specials, search, device)

        def with_drafts() -> list[list[Hypothesis]]:
            drafts = _drafts(decode.speculative, how, ready.decoding, sources, specials)
            checking = cast(Checking, ready.decoding)  # (Seq2SeqDecoding, compiled or not)
            speculation, tokens, limits = reporting.speculation, ready.tokens, ready.limits
            if not scored:
                outputs = speculative_search(checking, tokens, limits, specials, drafts, speculation)
                return [[Hypothesis(ids, float("nan"))] for ids in outputs]
            # a beam of one: each drafted token kept where the beam would choose it, and scored as it
            judge = OneBeam(torch.zeros(len(sources), device=ready.tokens.device), specials.eos)
            outputs = speculative_search(checking, tokens, limits, specials, drafts, speculation,
                                         normalised=True, judge=judge)  # fmt: skip
            return [[judge.hypothesis(r, ids, search)] for r, ids in enumerate(outputs)]

        def without() -> list[list[Hypothesis]]:
            if scored or not one_beam:  # beam search (of one beam where scored)
                return beam(ready.decoding, ready.tokens, ready.limits, specials, search)
            outputs = extend(ready.decoding, ready.tokens, ready.limits, specials, argmax)
            return [[Hypothesis(ids, float("nan"))] for ids in outputs]

        if paying is None:
            return without()
        return paying.searched(with_drafts, without, generated)  # the same outputs either way

    streams = stream_count(decode.streams, device, len(batches))
    with searching(model):
        return fill_by_batch(searched, batches, streams, found, reporting.progress)


def generated(found: list[list[Hypothesis]]) -> int:
    """The tokens a search of one beam generated: each source's best hypothesis and its ``</s>``."""
    return sum(len(hypotheses[0].tokens) + 1 for hypotheses in found)


def _drafts(
    speculative: str,
    how: SourceDecoding,
    decoding: Seq2SeqDecoding,
    sources: list[list[int]],
    specials: SpecialIds,
) -> Drafts:
    """What drafts the search of ``sources`` (ids with ``</s>``) by ``decoding`` checks: their own
    tokens, or the model's draft decoder's guesses over the same memory (``how.draft``)."""
    if speculative == "source":
        return SourceDrafts([ids[:-1] for ids in sources])  # (without </s>)
    assert how.draft is not None
    return ShallowDrafts(how.draft(decoding.src, decoding.memory), specials)
