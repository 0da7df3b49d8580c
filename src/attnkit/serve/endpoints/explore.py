"""``GET /explore?text=SENTENCE``: the attention explorer (``attnkit explore``'s page), every layer and
head of the model's attention on the sentence, with a text box that asks the server again.

At most ``--max-explore-tokens`` tokens of the text (and of the output it shows): the page grows with
their square. The work is queued as a request of its own, counted by ``--max-queue``, and runs while no
batch runs (it hooks the model). Engines without attention weights (CTranslate2) answer 404.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from attnkit.serve.bodies import Text
from attnkit.serve.errors import RequestError
from attnkit.serve.served import ServedModel
from attnkit.serve.state import server_of

router = APIRouter()


@router.get("/explore")
async def explore(request: Request, text: Text = "", target: Text | None = None) -> HTMLResponse:
    server = server_of(request)
    model: ServedModel = server.ready_model()
    if not model.shows_attention:
        message = f"the attention explorer needs attnkit's engine; this server runs {model.engine}"
        raise RequestError(404, "not_available", message)
    counts = await server.token_counts(model, [text, target or ""])
    limit = server.settings.max_explore_tokens
    for field, count in zip(("text", "target"), counts, strict=True):
        if count > limit:
            message = f"{field}: {count} tokens, more than the explorer's {limit} (--max-explore-tokens)"
            raise RequestError(413, "too_long", message)
    assert server.batcher is not None
    asked = server.batcher.alone(model.explore, text, target or None, "/explore", limit)
    page, status = await server.answered(request, asked)
    return HTMLResponse(page, status_code=status)
