"""What the decoder's endpoints (TGI's and OpenAI's dialects) share: a request's prompts checked and its
sampling settings made (:func:`prepared`), and a streamed answer (:func:`streamed`) whose pieces reach
the client while its batch generates.

Temperature 0 is greedy search. Prompt i of a request is seeded ``seed + i`` (``decode.seed`` when the
request names none), as ``attnkit generate`` seeds line i, so a prompt continues as the CLI continues it
whatever else shares its batch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request

from attnkit.errors import ConfigError
from attnkit.serve.bodies import MAX_SEED
from attnkit.serve.decoder import Prompt, Sampling, SamplingModel
from attnkit.serve.errors import RequestError
from attnkit.serve.state import ServerState


@dataclass
class Prepared:
    """A generation request, checked: its model, settings, prompts' token counts and first seed."""

    model: SamplingModel
    sampling: Sampling
    tokens: list[int]
    seed: int

    @property
    def positions(self) -> int:
        """The token positions its prompts' rows hold at most (each prompt and its new tokens)."""
        return self.model.positions(self.tokens, self.sampling)

    def prompts(self, texts: list[str], sinks: list[Callable[[str], None]] | None = None) -> list[Prompt]:
        """The batcher's inputs: prompt i seeded ``seed + i`` (with its sink, for a stream)."""
        return [Prompt(text, self.seed + i, sinks[i] if sinks else None) for i, text in enumerate(texts)]


async def prepared(server: ServerState, prompts: list[str], seed: int | None, **given: object) -> Prepared:
    """Check a request's prompts and settings (422 naming what is wrong, 413 for a prompt that leaves no
    room to continue); ``given`` are its sampling settings, the run's ``decode`` ones where None."""
    model: SamplingModel = server.ready_model()
    try:
        sampling = model.sampling(**given)
    except ConfigError as error:
        raise RequestError(422, "invalid_request", str(error).removeprefix("decode.")) from None
    if seed is not None and seed + len(prompts) - 1 > MAX_SEED:  # prompt i is seeded seed + i
        message = f"seed: {len(prompts)} prompts seeded from {seed} pass {MAX_SEED}, the largest seed"
        raise RequestError(422, "invalid_request", message)
    tokens = await server.token_counts(model, prompts)
    for i, count in enumerate(tokens):
        if count == 0:
            raise RequestError(422, "invalid_request", f"prompt {i}: empty; give at least one character")
    server.check_lengths(tokens, model.context - 1, "inputs")  # one position left to continue
    server.check_positions(model.positions(tokens, sampling))
    if seed is not None and sampling.temperature > 0 and not model.seeds_per_request:
        message = (
            f"seed: {model.engine} draws from one generator, seeded when the model loaded "
            f"(decode.seed {model.decode.seed}); per-request seeds need --engine attnkit"
        )
        raise RequestError(422, "invalid_request", message)
    return Prepared(model, sampling, tokens, model.decode.seed if seed is None else seed)


async def streamed(
    server: ServerState, request: Request, texts: list[str], asked: Prepared
) -> AsyncIterator[tuple[int, str, str | None]]:
    """``(prompt index, piece of text, None)`` as the batch generates, then ``(index, "", text)`` with
    each prompt's whole text: what the batch returned, for a client to keep (invalid UTF-8 may read
    otherwise piece by piece than whole). The request is queued before the stream starts, so that a
    full queue is still a 503; a client that leaves stops its prompts' generation."""
    loop, pieces = asyncio.get_running_loop(), asyncio.Queue()

    def sink_of(i: int) -> Callable[[str], None]:
        return lambda text: loop.call_soon_threadsafe(pieces.put_nowait, (i, text))

    inputs = asked.prompts(texts, [sink_of(i) for i in range(len(texts))])
    batched = server.batched(request, inputs, asked.sampling, sum(asked.tokens), asked.positions)
    waiting = asyncio.ensure_future(batched)
    await asyncio.sleep(0)  # queued, or refused at once
    if waiting.done():
        waiting.result()  # the refusal, raised before any response
    return _pieces(waiting, pieces)


async def _pieces(waiting: asyncio.Future, pieces: asyncio.Queue) -> AsyncIterator[tuple]:
    try:
        while not (waiting.done() and pieces.empty()):
            getting = asyncio.ensure_future(pieces.get())
            await asyncio.wait({getting, waiting}, return_when=asyncio.FIRST_COMPLETED)
            if getting.done():
                yield (*getting.result(), None)
            else:
                getting.cancel()
        for i, text in enumerate(waiting.result()):  # or the error the batch raised
            yield i, "", text
    finally:
        waiting.cancel()


def event(payload: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(payload)}\n\n"
