"""Text in, text out: tokenise, batch by length, search, restore the input order, detokenise."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from attnkit.config import DecodeConfig
from attnkit.cpu.compiled import compiled_decoding
from attnkit.cpu.streams import fill_by_batch, stream_count
from attnkit.data.batching import length_batches, pad
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.search import Hypothesis, beam_search, greedy
from attnkit.models import evaluating
from attnkit.models.seq2seq import EncoderDecoder


def translate(
    model: EncoderDecoder,
    tokenizer: Tokenizer,
    texts: list[str],
    decode: DecodeConfig,
    *,
    beam_size: int | None = None,
    device: torch.device | str = "cpu",
    warn: Callable[[str], None] | None = None,
    source_limit: int | None = None,
    progress: Callable[[int], None] | None = None,
    first_line: int = 1,
) -> list[str]:
    """Translate ``texts``; ``beam_size`` 1 is greedy search, default ``decode.beam_size``. On a CPU the
    batches are searched ``decode.streams`` at a time (cpu/streams.py).

    An empty (or all-space) input line gives an empty output line without running the model. The model
    handles at most ``model.config.max_len`` positions: a longer source is cut to fit and no output is
    longer, so that one pathological line cannot stall its batch; ``warn`` is told once how many were cut.
    ``source_limit`` cuts sources shorter still, to the length the model was trained on (a summariser's
    ``data.max_source_len``: it has only ever read an email's beginning). ``progress`` hears how many
    more lines are done, batch by batch; ``first_line`` is the number ``warn`` gives ``texts[0]`` (the
    command line translates a large input a part at a time).
    """
    found = _hypotheses(model, tokenizer, texts, decode, beam_size, 0, device, warn, source_limit, progress,
                        first_line)  # fmt: skip
    return [tokenizer.decode(hypotheses[0].tokens) if hypotheses else "" for hypotheses in found]


def translate_n_best(
    model: EncoderDecoder,
    tokenizer: Tokenizer,
    texts: list[str],
    decode: DecodeConfig,
    n_best: int,
    *,
    beam_size: int | None = None,
    device: torch.device | str = "cpu",
    warn: Callable[[str], None] | None = None,
    source_limit: int | None = None,
    progress: Callable[[int], None] | None = None,
    first_line: int = 1,
) -> list[list[tuple[str, float]]]:
    """The ``n_best`` best translations of each text with their scores (``log P / lp``, as beam search
    ranks them; see search.py), best first, by beam search of ``beam_size`` (at least ``n_best``; 1
    finds greedy search's translation, with its score); none for an empty line. Otherwise as
    :func:`translate`."""
    found = _hypotheses(model, tokenizer, texts, decode, beam_size, n_best, device, warn, source_limit,
                        progress, first_line)  # fmt: skip
    return [[(tokenizer.decode(h.tokens), h.score) for h in hypotheses] for hypotheses in found]


def _hypotheses(
    model: EncoderDecoder,
    tokenizer: Tokenizer,
    texts: list[str],
    decode: DecodeConfig,
    beam_size: int | None,
    n_best: int,
    device: torch.device | str,
    warn: Callable[[str], None] | None,
    source_limit: int | None,
    progress: Callable[[int], None] | None,
    first_line: int,
) -> list[list[Hypothesis]]:
    """Each text's hypotheses, best first: :func:`translate` (``n_best`` 0: greedy search when the beam
    is 1, without scores) and :func:`translate_n_best` (``n_best`` of them, always scored)."""
    beam = decode.beam_size if beam_size is None else beam_size
    if n_best > beam:
        raise ValueError(f"n_best ({n_best}) must not exceed the beam size ({beam})")
    specials, longest = tokenizer.specials, model.config.max_len
    limit = longest if source_limit is None else min(source_limit, longest)  # tokens with </s>
    encoded = tokenizer.encode_batch(texts)
    too_long = [i for i, ids in enumerate(encoded) if len(ids) + 1 > limit]
    if too_long and warn is not None:
        first = f"(line {too_long[0] + first_line}: {len(encoded[too_long[0]])} tokens)"
        if limit < longest:
            warn(f"{len(too_long)} input line(s) are longer than the {limit} source tokens the model was "
                 f"trained on (data.max_source_len) {first}; they are cut to {limit - 1} tokens, as in "
                 "training")  # fmt: skip
        else:
            warn(f"{len(too_long)} input line(s) have more tokens than the model's {longest} positions "
                 f"{first}; they are cut to {longest - 1} tokens, and outputs stop at {longest} "
                 "tokens")  # fmt: skip
    encoded = [[*ids[: limit - 1], specials.eos] for ids in encoded]
    found: list[list[Hypothesis]] = [[] for _ in texts]
    bounds = {"max_len_a": decode.max_len_a, "max_len_b": decode.max_len_b, "max_output_len": longest}
    todo = [i for i, text in enumerate(texts) if text.strip()]
    rules = {"penalty": decode.length_penalty, "stop": decode.beam_stop}
    batches = length_batches(todo, [len(ids) for ids in encoded], decode.batch_size)
    compiled = decode.compile and torch.device(device).type == "cpu" and bool(batches)

    def search(chunk: list[int], decoding: Callable | None) -> list[list[Hypothesis]]:
        src = pad([encoded[i] for i in chunk], specials.pad).to(device)
        if beam == 1 and not n_best:  # greedy: no scores wanted
            outputs = greedy(model, src, specials, **bounds, decoding=decoding)
            return [[Hypothesis(ids, float("nan"))] for ids in outputs]
        return beam_search(model, src, specials, beam, decode.alpha, n_best=max(n_best, 1), **rules, **bounds,
                           decoding=decoding)  # fmt: skip

    streams = stream_count(decode.streams, device, len(batches))
    if progress is not None:
        progress(len(texts) - len(todo))  # the empty lines
    with evaluating(model):  # the step is compiled (traced) in eval mode too
        decoding = compiled_decoding(model, beam, warn) if compiled else None  # None: model.decoding
        return fill_by_batch(partial(search, decoding=decoding), batches, streams, found, progress)
