"""Text Generation Inference's (HF TGI) dialect, for decoders: ``POST /generate`` ``{"inputs": PROMPT,
"parameters": {"max_new_tokens", "temperature", "top_k", "top_p", "stop", "seed"}}`` ->
``{"generated_text"}`` (the continuation, without the prompt); ``POST /generate_stream``: the same as
server-sent events, ``{"token": {"text"}, "generated_text": null}`` per piece of text, then one with
``generated_text`` set."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from attnkit.serve.bodies import GenerateBody
from attnkit.serve.endpoints.sampling import Prepared, event, prepared, streamed
from attnkit.serve.state import ServerState, server_of

router = APIRouter()


@router.post("/generate")
async def generate(request: Request, body: GenerateBody) -> dict:
    server = server_of(request)
    asked = await _prepared(server, body)
    prompts = asked.prompts([body.inputs])
    (text,) = await server.batched(request, prompts, asked.sampling, sum(asked.tokens), asked.positions)
    return {"generated_text": text}


@router.post("/generate_stream")
async def generate_stream(request: Request, body: GenerateBody) -> StreamingResponse:
    server = server_of(request)
    stream = await streamed(server, request, [body.inputs], await _prepared(server, body))

    async def events() -> AsyncIterator[str]:
        async for _, piece, whole in stream:
            yield event({"token": {"text": piece}, "generated_text": whole})

    return StreamingResponse(events(), media_type="text/event-stream")


async def _prepared(server: ServerState, body: GenerateBody) -> Prepared:
    p = body.parameters
    return await prepared(server, [body.inputs], p.seed, max_new_tokens=p.max_new_tokens,
                          temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, stop=p.stop)  # fmt: skip
