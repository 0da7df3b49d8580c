"""The endpoints of a decoder model, in the two formats generation clients speak.

- Text Generation Inference's (HF TGI): ``POST /generate`` ``{"inputs": PROMPT, "parameters":
  {"max_new_tokens", "temperature", "top_k", "top_p", "stop", "seed"}}`` -> ``{"generated_text"}``;
  ``POST /generate_stream``: the same as server-sent events, ``{"token": {"text"}, "generated_text":
  null}`` per piece of text, then one with ``generated_text`` set.
- OpenAI's: ``POST /v1/completions`` ``{"prompt": TEXT or [TEXT, ...], "max_tokens", "temperature",
  "top_p", "stop", "seed", "stream"}`` -> ``{"id", "object": "text_completion", "created", "model",
  "choices": [{"text", "index", "finish_reason"}], "usage"}``; with ``"stream": true`` server-sent
  events of ``choices`` pieces, then ``data: [DONE]``.

Temperature 0 is greedy search. Streams and whole answers go through the same batcher: a streaming
prompt's text reaches its client piece by piece while its batch runs.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from attnkit.errors import ConfigError
from attnkit.serve.bodies import MAX_SEED, CompletionBody, GenerateBody
from attnkit.serve.generator import Generator, Prompt, Sampling


def generation_routes(app: FastAPI, ready_model: Callable, check_lengths: Callable, answered: Callable,
                      refuse: Callable) -> None:  # fmt: skip
    """Add the decoder's endpoints to ``app``. ``answered(request, inputs, settings, tokens)`` awaits a
    batch's outputs; ``refuse(status, kind, message)`` makes the error to raise."""

    async def prepared(
        prompts: list[str], seed: int | None, **given
    ) -> tuple[Generator, Sampling, list[int], int]:
        generator: Generator = ready_model()
        try:
            sampling = generator.sampling(**given)
        except ConfigError as error:
            raise refuse(422, "invalid_request", str(error).removeprefix("decode.")) from None
        if seed is not None and seed + len(prompts) - 1 > MAX_SEED:  # prompt i is seeded seed + i
            raise refuse(422, "invalid_request", f"seed: {len(prompts)} prompts seeded from {seed} pass "
                         f"{MAX_SEED}, the largest seed")  # fmt: skip
        tokens = await asyncio.to_thread(generator.tokens, prompts)
        for i, count in enumerate(tokens):
            if count == 0:
                raise refuse(422, "invalid_request", f"prompt {i}: empty; give at least one character")
        check_lengths(tokens, generator.context - 1, "inputs")  # one position left to continue
        if seed is not None and sampling.temperature > 0 and not generator.seeds_per_request:
            raise refuse(422, "invalid_request", f"seed: {generator.engine} draws from one generator, "
                         f"seeded when the model loaded (decode.seed {generator.decode.seed}); "
                         "per-request seeds need --engine attnkit")  # fmt: skip
        return generator, sampling, tokens, generator.decode.seed if seed is None else seed

    async def streamed(request: Request, prompts: list[str], sampling: Sampling, seed: int,
                       tokens: int) -> AsyncIterator[tuple]:  # fmt: skip
        """``(prompt index, piece of text, None)`` as the batch generates, then ``(index, "", text)``
        with each prompt's whole text: what the batch returned, for a client to keep (invalid UTF-8
        may read otherwise piece by piece than whole). The request is queued before the stream
        starts, so that a full queue is still a 503."""
        loop, pieces = asyncio.get_running_loop(), asyncio.Queue()

        def sink_of(i: int) -> Callable[[str], None]:
            return lambda text: loop.call_soon_threadsafe(pieces.put_nowait, (i, text))

        inputs = [Prompt(text, seed + i, sink_of(i)) for i, text in enumerate(prompts)]
        waiting = asyncio.ensure_future(answered(request, inputs, sampling, tokens))
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

    async def tgi_prepared(body: GenerateBody) -> tuple[Sampling, list[int], int]:
        """A TGI request's settings, prompt length and seed."""
        p = body.parameters
        _, sampling, tokens, seed = await prepared([body.inputs], p.seed, max_new_tokens=p.max_new_tokens,
                                             temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                                             stop=p.stop)  # fmt: skip
        return sampling, tokens, seed

    @app.post("/generate")
    async def tgi_generate(request: Request, body: GenerateBody) -> dict:
        sampling, tokens, seed = await tgi_prepared(body)
        (text,) = await answered(request, [Prompt(body.inputs, seed)], sampling, sum(tokens))
        return {"generated_text": text}

    @app.post("/generate_stream")
    async def tgi_generate_stream(request: Request, body: GenerateBody) -> StreamingResponse:
        sampling, tokens, seed = await tgi_prepared(body)
        stream = await streamed(request, [body.inputs], sampling, seed, sum(tokens))

        async def events() -> AsyncIterator[str]:
            async for _, piece, whole in stream:
                yield _event({"token": {"text": piece}, "generated_text": whole})

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def openai_completions(request: Request, body: CompletionBody):
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if not prompts:
            raise refuse(422, "invalid_request", "prompt: give at least one")
        stop = [body.stop] if isinstance(body.stop, str) else body.stop
        generator, sampling, tokens, seed = await prepared(prompts, body.seed, max_new_tokens=body.max_tokens,
                                                     temperature=body.temperature, top_p=body.top_p,
                                                     stop=stop)  # fmt: skip
        name, made, ident = (
            body.model or generator.checkpoint.name,
            int(time.time()),
            f"cmpl-{uuid.uuid4().hex}",
        )

        def finish_reason(text: str) -> str:
            return "length" if generator.tokens([text])[0] >= sampling.max_new_tokens else "stop"

        def completion(choices: list[dict]) -> dict:
            return {"id": ident, "object": "text_completion", "created": made, "model": name,
                    "choices": choices}  # fmt: skip

        if not body.stream:
            asked = [Prompt(text, seed + i) for i, text in enumerate(prompts)]  # as attnkit generate seeds
            texts = await answered(request, asked, sampling, sum(tokens))
            produced = sum(generator.tokens(texts)) if texts else 0
            choices = [{"text": t, "index": i, "finish_reason": finish_reason(t), "logprobs": None}
                       for i, t in enumerate(texts)]  # fmt: skip
            usage = {"prompt_tokens": sum(tokens), "completion_tokens": produced,
                     "total_tokens": sum(tokens) + produced}  # fmt: skip
            return {**completion(choices), "usage": usage}

        stream = await streamed(request, prompts, sampling, seed, sum(tokens))

        async def events() -> AsyncIterator[str]:
            async for i, piece, whole in stream:
                reason = None if whole is None else finish_reason(whole)
                yield _event(
                    completion([{"text": piece, "index": i, "finish_reason": reason, "logprobs": None}])
                )
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def _event(payload: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(payload)}\n\n"
