"""The HTTP server of one trained model: a FastAPI app, its endpoints, errors and metrics.

Endpoints (translation and summarisation models):

- ``POST /translator/translate``: OpenNMT-py's REST format, so that its clients work unchanged:
  ``[{"src": "...", "id": 100}, ...]`` -> ``[[{"src", "tgt", "pred_score", "n_best"}, ...]]`` (one
  inner list holding every input's ``n_best`` results, in order); per request ``beam_size`` and
  ``n_best`` (as ``attnkit translate --beam --n-best``). ``id`` names a model in OpenNMT-py, which
  serves several; this server serves one and ignores it.
- ``GET /health``: 200 ``{"status": "ready"}`` once the model is loaded, 503 before (orchestrators
  send traffic only then); never needs the API key.
- ``GET /info``: the model's architecture, configuration and attnkit's version.
- ``GET /metrics``: Prometheus text (``prometheus-client``): requests by endpoint and status, and in
  progress; errors by kind, queue length, batch sizes, batch time, output tokens (their rate is
  tokens/s), request latency.

Errors are JSON ``{"error": "...", "kind": "..."}`` naming what was wrong, and none stops the server:
malformed JSON 400; a missing field or a wrong type 422 (the field named); a body over
``--max-body-bytes``, an input longer than the model reads, or a request over the server's token budget,
413; a full queue 503 with ``Retry-After``; a missing or wrong API key 401; an unknown path 404. Every
bound, with its default and its error, is listed in docs/serving.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from attnkit.serve.batcher import Batcher, QueueFullError
from attnkit.serve.bodies import PredictBody, Text, TranslateItem
from attnkit.serve.generation import generation_routes
from attnkit.serve.metrics import Metrics
from attnkit.serve.middleware import CountRequests, Guard, error_response
from attnkit.serve.predictor import Predictor
from attnkit.serve.served import ServedModel
from attnkit.serve.translator import Translator

DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is still there
LOG = logging.getLogger("uvicorn.error")  # the server's log, beside uvicorn's own lines
KIND_OF_STATUS = {400: "malformed_request", 404: "not_found", 405: "method_not_allowed"}


@dataclass
class ServeSettings:
    """What ``attnkit serve``'s options set."""

    max_batch_tokens: int = 4096  # source tokens of all requests in one batch
    max_wait_ms: float = 0.0  # how long a batch waits for more requests after its first
    max_queue: int = 256  # requests waiting at most (explorer pages too); more are refused (503)
    api_key: str = ""  # when set, every endpoint but /health needs "Authorization: Bearer KEY"
    retry_after_s: int = 1  # what a 503 asks the client to wait
    max_body_bytes: int = 1_048_576  # a larger request body is refused (413) before it is read whole
    max_explore_tokens: int = 64  # /explore: tokens of the text (and of the output it shows), at most
    stall_after_s: float = 300.0  # /health says "stalled" when requests wait this long with no batch moving
    hosts: tuple[str, ...] = ()  # the Host header names accepted (empty: any)


class RequestError(Exception):
    """A request the server refuses with ``status`` and a message (not a failure of the server)."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, headers or {}


def make_app(
    load: Callable[[], ServedModel],
    settings: ServeSettings,
    kind: str,
    stopping: Callable[[], bool] = lambda: False,
) -> FastAPI:
    """The app serving the model that ``load()`` returns: ``kind`` "translate" (a translator),
    "predict" (an encoder's predictor) or "generate" (a decoder's generator); it loads in a thread
    once the server starts, so that ``/health`` answers "loading" meanwhile. ``stopping()`` says
    whether the server is shutting down (a request cut off then is told so; otherwise its client has
    gone)."""
    metrics = Metrics()
    state: dict[str, Any] = {"model": None, "batcher": None, "failed": None}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        def loaded() -> None:
            try:
                model = load()
            except Exception as error:  # said by /health; the server stays up to say it
                state["failed"] = str(error)
                return
            loop.call_soon_threadsafe(_ready, model)

        def _ready(model: ServedModel) -> None:
            batcher = Batcher(model.run, max_batch_tokens=settings.max_batch_tokens,
                              max_wait_ms=settings.max_wait_ms, max_queue=settings.max_queue,
                              workers=model.streams, prepare=model.prepare_worker,
                              observe=metrics.batch, abandon=model.abandon)  # fmt: skip
            batcher.start()
            state["model"], state["batcher"] = model, batcher

        threading.Thread(target=loaded, name="attnkit-load", daemon=True).start()
        yield
        if state["batcher"] is not None:
            await state["batcher"].stop()

    # the interactive docs (/docs, /redoc) would load their scripts from a CDN: off; /openapi.json stays
    app = FastAPI(title="attnkit", version=version("attnkit"), lifespan=lifespan, docs_url=None,
                  redoc_url=None)  # fmt: skip

    @app.exception_handler(RequestError)
    async def refused(request: Request, error: RequestError) -> JSONResponse:
        metrics.errors.labels(error.kind).inc()
        return error_response(error.status, error.kind, str(error), error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        if any(problem.get("type") == "json_invalid" for problem in problems):
            return await refused(
                request, RequestError(400, "malformed_json", "the request body is not valid JSON")
            )
        first = problems[0]
        where = ".".join(str(part) for part in first.get("loc", ())[1:]) or "body"
        return await refused(
            request, RequestError(422, "invalid_request", f"{where}: {first.get('msg', 'invalid')}")
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        """Starlette's and FastAPI's own refusals (an unknown path, a wrong method, a body that is not
        UTF-8 or nests too deep to parse), in the server's error format."""
        if error.status_code == 400:  # FastAPI could not parse the body
            error = RequestError(
                400, "malformed_json", "the request body is not JSON in UTF-8 (or nests too deep)"
            )
        else:
            kind = KIND_OF_STATUS.get(error.status_code, "http_error")
            error = RequestError(
                error.status_code, kind, f"{request.url.path}: {error.detail}", error.headers
            )
        return await refused(request, error)

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception) -> JSONResponse:
        """A bug: JSON like every other error (the traceback goes to the log, not to the client)."""
        metrics.errors.labels("internal_error").inc()
        return error_response(
            500, "internal_error", f"the server failed on this request ({type(error).__name__})"
        )

    def ready_model() -> Any:
        if state["model"] is None:
            raise RequestError(503, "loading", state["failed"] or "the model is still loading",
                               {"Retry-After": str(settings.retry_after_s)})  # fmt: skip
        return state["model"]

    def check_lengths(tokens: list[int], limit: int, field: str) -> None:
        """413 for an input longer than the model reads, or a request over the server's budget."""
        if max(tokens) > limit:
            raise RequestError(
                413, "too_long", f"{field}: {max(tokens)} tokens, more than the model's {limit}"
            )
        if sum(tokens) > settings.max_batch_tokens:
            message = (f"body: {sum(tokens)} tokens, more than the server's --max-batch-tokens "
                       f"{settings.max_batch_tokens}")  # fmt: skip
            raise RequestError(413, "too_long", message)

    async def answered(request: Request, work: Awaitable[Any]) -> Any:
        """What ``work`` (the batcher's answer to this request) gives; the request is dropped from the
        queue, or abandoned by its batch, if its client disconnects meanwhile."""
        waiting = asyncio.ensure_future(work)
        try:
            while not waiting.done():
                await asyncio.wait({waiting}, timeout=DISCONNECT_POLL_S)
                if not waiting.done() and await request.is_disconnected():
                    raise RequestError(499, "client_gone", "the client disconnected")
            return waiting.result()
        except QueueFullError as full:
            raise RequestError(503, "queue_full", str(full),
                               {"Retry-After": str(settings.retry_after_s)}) from None  # fmt: skip
        except RequestError:
            raise
        except asyncio.CancelledError:
            if not stopping():  # a stream whose client has gone: its response is cancelled
                metrics.errors.labels("client_gone").inc()
                LOG.info(
                    "%s: the client disconnected; its request is dropped", request.url.path
                )  # not an error
                raise
            # uvicorn cuts off what is left past the grace period of a SIGTERM
            raise RequestError(503, "shutting_down", "the server stopped before this request's turn came",
                               {"Retry-After": str(settings.retry_after_s)}) from None  # fmt: skip
        except Exception as error:  # the model failed on this request's inputs: this request fails alone
            raise RequestError(500, "model_error", f"{type(error).__name__}: {error}") from None
        finally:  # answered, refused, or cut off (a server past its grace period): out of the queue
            waiting.cancel()

    def batched(request: Request, inputs: list[Any], decode: Any, tokens: int) -> Awaitable[Any]:
        """The outputs of ``inputs`` once their batch has run (see ``answered``)."""
        return answered(request, state["batcher"].submit(inputs, decode, tokens))

    @app.get("/health")
    async def health() -> JSONResponse:
        if state["failed"]:
            return JSONResponse({"status": "failed", "error": state["failed"]}, status_code=503)
        if state["model"] is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        stalled = state["batcher"].stalled_for()
        if stalled > settings.stall_after_s:
            said = f"requests have waited {stalled:.0f} s without a batch starting or ending"
            return JSONResponse({"status": "stalled", "error": said}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/info")
    async def info() -> dict:
        """What a client needs to know of the model and the server (no paths of the server's machine)."""
        model = ready_model()
        served = dataclasses.asdict(settings) | {"api_key": bool(settings.api_key)}
        return {"attnkit": version("attnkit"), "checkpoint": model.checkpoint.name, **model.describe(),
                "serve": served}  # fmt: skip

    @app.get("/metrics")
    async def prometheus() -> Response:
        batcher = state["batcher"]
        metrics.queue.set(batcher.waiting() if batcher else 0)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/explore")
    async def explore(request: Request, text: Text = "", target: Text | None = None) -> HTMLResponse:
        """The attention explorer (``attnkit explore``'s page) on ``text``: every layer and head, of at
        most ``--max-explore-tokens`` tokens (the page grows with their square); queued as a request of
        its own and run while no batch runs (it hooks the model)."""
        model: ServedModel = ready_model()
        if not model.shows_attention:
            raise RequestError(404, "not_available", f"the attention explorer needs attnkit's engine; "
                               f"this server runs {model.engine}")  # fmt: skip
        counts = await asyncio.to_thread(model.tokens, [text, target or ""])
        limit = settings.max_explore_tokens
        for field, count in zip(("text", "target"), counts, strict=True):
            if count > limit:
                raise RequestError(413, "too_long", f"{field}: {count} tokens, more than the explorer's "
                                   f"{limit} (--max-explore-tokens)")  # fmt: skip
        asked = state["batcher"].alone(model.explore, text, target or None, "/explore", limit)
        page, status = await answered(request, asked)
        return HTMLResponse(page, status_code=status)

    if kind == "predict":
        _prediction_route(app, ready_model, check_lengths, batched)
    elif kind == "generate":
        generation_routes(app, ready_model, check_lengths, batched, RequestError)
    else:
        _translation_route(app, ready_model, check_lengths, batched, metrics)
    # added last, so that the counting knows every route; Guard runs inside CountRequests
    app.add_middleware(Guard, metrics=metrics, api_key=settings.api_key,
                       max_body_bytes=settings.max_body_bytes, hosts=settings.hosts)  # fmt: skip
    app.add_middleware(CountRequests, metrics=metrics, routes=frozenset(r.path for r in app.routes))
    return app


def _translation_route(app: FastAPI, ready_model: Callable, check_lengths: Callable, batched: Callable,
                       metrics: Metrics) -> None:  # fmt: skip
    """``POST /translator/translate`` (OpenNMT-py's format), for translation and summarisation."""

    @app.post("/translator/translate")
    async def translate(request: Request, items: list[TranslateItem]) -> list[list[dict]]:
        translator: Translator = ready_model()
        if not items:
            raise RequestError(422, "invalid_request", 'body: give at least one {"src": ...}')
        settings_of = {(item.beam_size or translator.beam_size, item.n_best) for item in items}
        if len(settings_of) > 1:
            raise RequestError(
                422, "invalid_request", "body: one request's inputs share beam_size and n_best"
            )
        beam, n_best = settings_of.pop()
        if n_best > beam:
            raise RequestError(422, "invalid_request", f"n_best: {n_best} needs beam_size {n_best} or more")
        texts = [item.src for item in items]
        tokens = await asyncio.to_thread(translator.tokens, texts)
        check_lengths(tokens, translator.max_source_tokens, "src")
        found = await batched(request, texts, (beam, n_best), sum(tokens))
        results = []
        for text, best in zip(texts, found, strict=True):
            # an empty input has no hypotheses: it gets n_best empty outputs (as the CLI prints an
            # empty line), so that the results line up with the inputs
            for target, score in best or [("", 0.0)] * n_best:
                metrics.output_tokens.inc(translator.output_tokens(target))
                results.append({"src": text, "tgt": target, "pred_score": score, "n_best": n_best})
        return [results]


def _prediction_route(
    app: FastAPI, ready_model: Callable, check_lengths: Callable, batched: Callable
) -> None:
    """``POST /predict``, for encoder models (classification, question answering, masked-LM)."""

    @app.post("/predict")
    async def predict(request: Request, body: PredictBody) -> dict:
        predictor: Predictor = ready_model()
        problem = predictor.problem(body.inputs)
        if problem:
            raise RequestError(422, "invalid_request", problem)
        tokens = await asyncio.to_thread(predictor.tokens, body.inputs)
        check_lengths(tokens, predictor.max_tokens, "inputs")
        lines = await batched(request, body.inputs, None, sum(tokens))
        return {"outputs": [predictor.as_json(line) for line in lines]}
