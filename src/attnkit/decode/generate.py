"""Text in, text out for a decoder-only model: continue prompts by greedy search or sampling.

Prompts are batched by length and left-padded; each prompt samples from its own generator (seeded
``decode.seed + i`` for the i-th prompt, from 0), so a prompt's continuation is the same whichever prompts
share its batch, and whether batches run side by side (``decode.streams``). Generation ends at
``</s>``, at ``decode.max_new_tokens``, at the model's context (``max_len`` positions, prompt included)
or where a ``decode.stop`` string appears; the returned text stops before that string.
Whoever follows the generation (:class:`Listening`) hears each prompt's text as it is generated
(streaming, ``on_text(i, new_text)``); a character whose UTF-8 bytes are still arriving, and text that
may still turn out to be the start of a stop string, are held back until that is settled, so the pieces
add up to the result. It may also say after each step whether prompt i's continuation is still wanted
(``wanted(i)``: a server's client may have gone): a row that is not ends there. Finding stop strings
costs time linear in their length at each step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from attnkit.config import DecodeConfig
from attnkit.data.batching import length_batches
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.drafts import ContextDrafts, Drafts, DraftSampling, ShallowDrafts, require_draft
from attnkit.decode.search import extend
from attnkit.decode.speculative import (
    ROWS_DRAFTED,
    Economy,
    Speculation,
    economy,
    greedy_judge,
    speculative_search,
)
from attnkit.decode.speculative_sampling import sampling_judge
from attnkit.decode.starts import encode_prompts, prompt_sampler, ready_prompts, searching
from attnkit.decode.streams import fill_by_batch, stream_count
from attnkit.models import device_of
from attnkit.models.decoder_only import DecoderModel
from attnkit.models.decoding import CausalDecoding
from attnkit.models.draft import ShallowCausalDraft

OnText = Callable[[int, str], None]


@dataclass(frozen=True)
class Listening:
    """Who follows a generation as it goes (see the module docstring): ``on_text(i, new_text)`` hears
    prompt i's text as it grows; ``wanted(i)`` says whether prompt i's continuation is still wanted."""

    on_text: OnText | None = None
    wanted: Callable[[int], bool] | None = None


NOBODY = Listening()  # nobody follows: the texts are returned whole


def generate(
    model: DecoderModel,
    tokenizer: Tokenizer,
    prompts: list[str],
    decode: DecodeConfig,
    *,
    listening: Listening = NOBODY,
    progress: Callable[[int], None] | None = None,
    first: int = 0,
    seeds: list[int] | None = None,
    speculation: Speculation | None = None,
) -> list[str]:
    """The continuation of each prompt (without the prompt itself). ``progress`` hears how many more
    prompts are done, batch by batch; ``first`` is the number of ``prompts[0]`` among all the prompts
    (from 0), for its seed (``decode.seed + first``, and so on) and the errors' prompt numbers, when a
    long list is continued a part at a time. ``seeds``: each prompt's own seed instead (a server's
    requests, each with the seed its client chose, whatever the batch). ``listening``: see the module
    docstring. With ``decode.speculative=source`` generation checks drafts copied from each prompt and
    its text so far, with ``shallow`` (or a checkpoint's folder) the guesses of the model's draft
    (``speculation`` counts what they did): greedy generation (``decode.temperature=0``) where they
    have paid so far (``Economy``), for the same texts in fewer steps where the drafts are right
    (decode/speculative.py); sampling in every batch, for texts drawn from the model's own
    distribution (decode/speculative_sampling.py), but not the ones plain sampling draws."""
    drafting = _drafting(model, decode, speculation)
    encoded = encode_prompts(tokenizer, prompts, model.config.max_len, first)
    device = device_of(model)  # the prompts go where the model is
    seeds = seeds or [decode.seed + first + i for i in range(len(prompts))]
    outputs = [""] * len(prompts)
    batches = length_batches(range(len(prompts)), [len(ids) for ids in encoded], decode.batch_size)
    # Side by side on a CPU (decode/streams.py), unless text is streamed: on_text then hears from one thread.
    streams = 1 if listening.on_text is not None else stream_count(decode.streams, device, len(batches))

    def continue_batch(rows: list[int]) -> list[str]:
        prompts = [encoded[i] for i in rows]
        stream = TextStream(tokenizer, decode.stop, rows, listening.on_text, listening.wanted)
        own_seeds = [seeds[i] for i in rows]
        return _generate_batch(model, tokenizer, prompts, own_seeds, decode, device, stream, drafting)

    with searching(model):
        return fill_by_batch(continue_batch, batches, streams, outputs, progress)


@torch.no_grad()  # here, in the thread that runs the batch: gradient mode is per thread
def _generate_batch(
    model: DecoderModel,
    tokenizer: Tokenizer,
    prompts: list[list[int]],
    seeds: list[int],
    decode: DecodeConfig,
    device: torch.device | str,
    stream: TextStream,
    drafting: _Drafting | None = None,
) -> list[str]:
    """Continue one batch of encoded prompts; ``seeds`` are their generators' seeds, ``stream`` decodes
    the rows as they grow; with ``drafting``, generation checks drafts: greedy generation where they
    pay, sampling in every batch (decode/speculative_sampling.py)."""
    ready = ready_prompts(model, prompts, tokenizer.specials.pad, decode, device)
    specials = tokenizer.specials
    generators = [torch.Generator(device).manual_seed(seed) for seed in seeds]

    def with_drafts() -> list[list[int]]:
        assert drafting is not None
        checking = cast(CausalDecoding, ready.decoding)
        sampling = None
        if decode.temperature > 0:
            sampling = DraftSampling(generators, decode.temperature, decode.top_k, decode.top_p)
        drafts = _drafts(model, decode, prompts, checking.prompt_valid, tokenizer, sampling)
        judge = greedy_judge if sampling is None else sampling_judge(drafts, sampling)
        observe = stream.observe if stream.watching else None
        most_rows = ROWS_DRAFTED if sampling is None else len(prompts)  # sampling: every row, every step
        return speculative_search(
            checking, ready.tokens, ready.limits, specials, drafts, drafting.speculation, most_rows,
            normalised=True, observe=observe, judge=judge, plain_first=sampling is not None,
        )  # fmt: skip

    def without() -> list[list[int]]:
        choose = prompt_sampler(generators, decode)
        return extend(ready.decoding, ready.tokens, ready.limits, specials, choose, stream.observe)

    if drafting is None:
        generated = without()
    elif drafting.paying is None:  # sampling: drafts in every batch (the choice would change the texts)
        generated = with_drafts()
    else:  # greedy: drafts where they have paid (the same texts either way)
        generated = drafting.paying.searched(with_drafts, without)
    return [stream.finish(row, ids) for row, ids in enumerate(generated)]


def _drafts(
    model: DecoderModel,
    decode: DecodeConfig,
    prompts: list[list[int]],
    valid: Tensor,
    tokenizer: Tokenizer,
    sampling: DraftSampling | None = None,
) -> Drafts:
    """What generation of ``prompts`` checks: drafts copied from each prompt and its text so far, or the
    guesses of the model's draft (its draft decoder, or another GPT), stepped over the same left-padded
    prompts (``valid (N, P)``: their real tokens): its greedy choices, or with ``sampling`` its samples."""
    if decode.speculative == "source":
        return ContextDrafts.for_vocabulary(prompts, tokenizer.vocab_size)
    draft = cast(ShallowCausalDraft | DecoderModel, model.draft)  # its draft decoder, or another GPT
    return ShallowDrafts(draft.decoding(valid), tokenizer.specials, sampling)


@dataclass(frozen=True)
class _Drafting:
    """Generation's drafts: where greedy generation's pay (``paying``; None for sampling, which drafts
    every batch), and the count of what they did."""

    paying: Economy | None
    speculation: Speculation | None


def _drafting(model: DecoderModel, decode: DecodeConfig, speculation: Speculation | None) -> _Drafting | None:
    """Whether generation with ``decode`` checks drafts: greedy generation where they pay (the
    :class:`Economy` that chooses batch by batch), sampling always (the choice would change the texts);
    None where no drafts are asked for."""
    if decode.speculative == "none":
        return None
    require_draft(model, decode.speculative, "; or decode.speculative=source drafts from each prompt and its "
                  "text so far")  # fmt: skip
    paying = economy(model, f"{decode.speculative}, eager steps") if decode.temperature == 0 else None
    return _Drafting(paying, speculation)


class TextStream:
    """Decodes the rows as they grow: finds stop strings and passes new text to ``on_text``; ``finish``
    gives a row's text, up to its first stop string (also for an engine that does not stop at them).
    ``indices`` are the rows' places in the caller's list of prompts (what ``on_text`` and ``wanted``
    are told)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        stop: list[str],
        indices: list[int],
        on_text: OnText | None,
        wanted: Callable[[int], bool] | None = None,
    ):
        self.tokenizer, self.stop, self.indices, self.on_text = tokenizer, stop, indices, on_text
        self.wanted = wanted
        self.borders = [borders(s) for s in stop]
        self.sent = [0] * len(indices)  # characters already passed to on_text
        self.stopped = [False] * len(indices)

    @property
    def watching(self) -> bool:
        """Whether :meth:`observe` has anything to do: stop strings to find, text to pass on, rows to
        ask after."""
        return bool(self.stop) or self.on_text is not None or self.wanted is not None

    def _cut(self, text: str) -> tuple[str, bool]:
        """``text`` up to the first stop string, and whether there was one."""
        found = [text.index(s) for s in self.stop if s in text]
        return (text[: min(found)], True) if found else (text, False)

    def _settled(self, text: str) -> str:
        """``text`` without a tail that may still grow into a stop string or a multi-byte character."""
        held = max(
            (prefix_at_end(text, s, border) for s, border in zip(self.stop, self.borders, strict=True)),
            default=0,
        )
        return text[: len(text) - held].rstrip("\ufffd")

    def _send(self, row: int, text: str) -> None:
        if self.on_text is not None and len(text) > self.sent[row]:
            self.on_text(self.indices[row], text[self.sent[row] :])
            self.sent[row] = len(text)

    def observe(self, generated: Tensor) -> Tensor:
        """After each step: the rows that reached a stop string, or are no longer wanted, end now."""
        if not self.watching:
            return None
        for row, ids in enumerate(generated.tolist()):
            if self.stopped[row]:
                continue
            if self.wanted is not None and not self.wanted(self.indices[row]):
                self.stopped[row] = True
                continue
            text, self.stopped[row] = self._cut(self.tokenizer.decode(ids))
            self._send(row, text if self.stopped[row] else self._settled(text))
        return torch.tensor(self.stopped, device=generated.device)

    def finish(self, row: int, ids: list[int]) -> str:
        text, _ = self._cut(self.tokenizer.decode(ids))
        self._send(row, text)
        return text


def borders(pattern: str) -> list[int]:
    """Knuth-Morris-Pratt's table: ``table[i]``, the length of the longest proper prefix of
    ``pattern[: i + 1]`` that is also its suffix."""
    table, k = [0] * len(pattern), 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = table[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        table[i] = k
    return table


def prefix_at_end(text: str, pattern: str, table: list[int]) -> int:
    """The longest ``k < len(pattern)`` such that ``text`` ends with ``pattern[:k]`` (text that may still
    grow into ``pattern``), in time linear in ``len(pattern)``: the KMP automaton run over the last
    ``len(pattern) - 1`` characters (``table`` is :func:`borders` of ``pattern``)."""
    k = 0
    for character in text[max(0, len(text) - len(pattern) + 1) :] if len(pattern) > 1 else "":
        while k and pattern[k] != character:
            k = table[k - 1]
        if pattern[k] == character:
            k += 1
    return k
