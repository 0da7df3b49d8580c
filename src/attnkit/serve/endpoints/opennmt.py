"""``POST /translator/translate``, OpenNMT-py's REST format, so that its clients work unchanged
(translation and summarisation models).

``[{"src": "...", "id": 100}, ...]`` -> ``[[{"src", "tgt", "pred_score", "n_best"}, ...]]``: one inner
list holding every input's ``n_best`` results, in order; per request ``beam_size`` and ``n_best`` (as
``attnkit translate --beam --n-best``). ``id`` names a model in OpenNMT-py, which serves several; this
server serves one and ignores it. An empty or blank input gets ``n_best`` empty outputs, so that the
results line up with the inputs (the CLI prints an empty line).

The handler reads its body itself (``bodies.parsed``: the checks and errors FastAPI's would give) and
answers a response of its own (nothing for FastAPI to encode again): it is the server's hot path.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from attnkit.decode.search import BeamSettings, Translation
from attnkit.serve.bodies import TranslateItem, TranslateItems, parsed
from attnkit.serve.errors import RequestError
from attnkit.serve.state import server_of

router = APIRouter()
# the body /openapi.json describes (the handler reads it itself)
BODY = {"type": "array", "items": TranslateItem.model_json_schema()}


@router.post(
    "/translator/translate",
    response_model=None,
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": BODY}}}},
)
async def translate(request: Request) -> JSONResponse:
    items = parsed(await request.body(), TranslateItems)
    server = server_of(request)
    translator = server.ready_model()
    if not items:
        raise RequestError(422, "invalid_request", 'body: give at least one {"src": ...}')
    asked = {(item.beam_size or translator.beam_size, item.n_best) for item in items}
    if len(asked) > 1:
        raise RequestError(422, "invalid_request", "body: one request's inputs share beam_size and n_best")
    ((beam, n_best),) = asked
    try:
        settings = BeamSettings(beam, n_best)
    except ValueError:
        raise RequestError(
            422, "invalid_request", f"n_best: {n_best} needs beam_size {n_best} or more"
        ) from None
    texts = [item.src for item in items]
    tokens = await server.token_counts(translator, texts)
    server.check_lengths(tokens, translator.max_source_tokens, "src")
    positions = translator.positions(tokens, settings)
    server.check_positions(positions)
    found = await server.batched(request, texts, settings, sum(tokens), positions)
    results, generated = [], 0
    for text, best in zip(texts, found, strict=True):
        for target, score, tokens in best or [Translation("", 0.0, 0)] * n_best:  # an empty input: none
            generated += tokens  # (counted by the search, not by tokenising the text again)
            results.append({"src": text, "tgt": target, "pred_score": score, "n_best": n_best})
    server.metrics.output_tokens.inc(generated)
    return JSONResponse([results])
