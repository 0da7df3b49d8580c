"""OpenAI's completions dialect, for decoders: ``POST /v1/completions`` ``{"prompt": TEXT or [TEXT, ...],
"max_tokens", "temperature", "top_p", "stop", "seed", "stream"}`` -> ``{"id", "object":
"text_completion", "created", "model", "choices": [{"text", "index", "finish_reason"}], "usage"}``;
with ``"stream": true``, server-sent events of one-choice chunks, each prompt's last with its
``finish_reason``, then ``data: [DONE]``."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from attnkit.serve.bodies import CompletionBody
from attnkit.serve.endpoints.sampling import Prepared, event, prepared, streamed
from attnkit.serve.errors import RequestError
from attnkit.serve.state import server_of

router = APIRouter()


@router.post("/v1/completions", response_model=None)
async def completions(request: Request, body: CompletionBody) -> dict | StreamingResponse:
    server = server_of(request)
    texts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if not texts:
        raise RequestError(422, "invalid_request", "prompt: give at least one")
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    asked = await prepared(server, texts, body.seed, max_new_tokens=body.max_tokens,
                           temperature=body.temperature, top_p=body.top_p, stop=stop)  # fmt: skip
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": body.model or asked.model.checkpoint.name}  # fmt: skip
    if not body.stream:
        prompts = asked.prompts(texts)
        outputs = await server.batched(request, prompts, asked.sampling, sum(asked.tokens), asked.positions)
        produced = sum(asked.model.tokens(outputs)) if outputs else 0
        choices = [_choice(asked, i, text, text) for i, text in enumerate(outputs)]
        usage = {"prompt_tokens": sum(asked.tokens), "completion_tokens": produced,
                 "total_tokens": sum(asked.tokens) + produced}  # fmt: skip
        return {**head, "choices": choices, "usage": usage}
    stream = await streamed(server, request, texts, asked)

    async def events() -> AsyncIterator[str]:
        async for i, piece, whole in stream:
            yield event({**head, "choices": [_choice(asked, i, piece, whole)]})
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def _choice(asked: Prepared, index: int, text: str, whole: str | None) -> dict:
    """One choice: ``text`` of prompt ``index``, with its finish reason once ``whole`` is known."""
    reason = None if whole is None else _finish_reason(asked, whole)
    return {"text": text, "index": index, "finish_reason": reason, "logprobs": None}


def _finish_reason(asked: Prepared, whole: str) -> str:
    return "length" if asked.model.tokens([whole])[0] >= asked.sampling.max_new_tokens else "stop"
