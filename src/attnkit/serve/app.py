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
malformed JSON 400; a missing field or a wrong type 422 (the field named); an input longer than the
model reads, or a request over the server's token budget, 413; a full queue 503 with ``Retry-After``;
a missing or wrong API key 401.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, Field

from attnkit.serve.batcher import Batcher, QueueFullError
from attnkit.serve.generation import generation_routes
from attnkit.serve.predictor import Predictor
from attnkit.serve.served import ServedModel
from attnkit.serve.translator import Translator

DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is still there


@dataclass
class ServeSettings:
    """What ``attnkit serve``'s options set."""

    max_batch_tokens: int = 4096  # source tokens of all requests in one batch
    max_wait_ms: float = 0.0  # how long a batch waits for more requests after its first
    max_queue: int = 256  # requests waiting at most; more are refused (503)
    api_key: str = ""  # when set, every endpoint but /health needs "Authorization: Bearer KEY"
    retry_after_s: int = 1  # what a 503 asks the client to wait


class TranslateItem(BaseModel):
    """One input of OpenNMT-py's request format."""

    src: str
    id: int = 100
    beam_size: int | None = Field(default=None, ge=1, le=64)
    n_best: int = Field(default=1, ge=1, le=64)


class RequestError(Exception):
    """A request the server refuses with ``status`` and a message (not a failure of the server)."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, headers or {}


@dataclass
class Metrics:
    """The server's Prometheus metrics, in a registry of its own."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("attnkit_requests", "HTTP requests", ["endpoint", "status"], registry=r)
        self.errors = Counter("attnkit_errors", "Refused or failed requests by kind", ["kind"], registry=r)
        self.queue = Gauge("attnkit_queue_length", "Requests waiting for a batch", registry=r)
        self.in_progress = Gauge(
            "attnkit_requests_in_progress", "Requests being answered", ["endpoint"], registry=r
        )
        self.batch_requests = Histogram("attnkit_batch_requests", "Requests per batch", registry=r,
                                        buckets=(1, 2, 4, 8, 16, 32, 64, 128))  # fmt: skip
        self.batch_inputs = Histogram("attnkit_batch_inputs", "Inputs (sentences) per batch", registry=r,
                                      buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))  # fmt: skip
        self.batch_seconds = Histogram("attnkit_batch_seconds", "Time to run one batch", registry=r)
        self.output_tokens = Counter("attnkit_output_tokens", "Tokens of the outputs", registry=r)
        self.latency = Histogram("attnkit_request_seconds", "Request latency", ["endpoint"], registry=r)


def make_app(load: Callable[[], ServedModel], settings: ServeSettings, kind: str) -> FastAPI:
    """The app serving the model that ``load()`` returns: ``kind`` "translate" (a translator),
    "predict" (an encoder's predictor) or "generate" (a decoder's generator); it loads in a thread
    once the server starts, so that ``/health`` answers "loading" meanwhile."""
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
                              observe=_observe)  # fmt: skip
            batcher.start()
            state["model"], state["batcher"] = model, batcher

        threading.Thread(target=loaded, name="attnkit-load", daemon=True).start()
        yield
        if state["batcher"] is not None:
            await state["batcher"].stop()

    def _observe(requests: int, inputs: int, seconds: float) -> None:
        metrics.batch_requests.observe(requests)
        metrics.batch_inputs.observe(inputs)
        metrics.batch_seconds.observe(seconds)

    app = FastAPI(title="attnkit", version=version("attnkit"), lifespan=lifespan)

    app.add_middleware(CountAndGuard, settings=settings, metrics=metrics)

    @app.exception_handler(RequestError)
    async def refused(request: Request, error: RequestError) -> JSONResponse:
        metrics.errors.labels(error.kind).inc()
        return _error(error)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        if any(problem.get("type") == "json_invalid" for problem in problems):
            metrics.errors.labels("malformed_json").inc()
            return _error(RequestError(400, "malformed_json", "the request body is not valid JSON"))
        first = problems[0]
        where = ".".join(str(part) for part in first.get("loc", ())[1:]) or "body"
        metrics.errors.labels("invalid_request").inc()
        return _error(RequestError(422, "invalid_request", f"{where}: {first.get('msg', 'invalid')}"))

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

    async def answered(request: Request, inputs: list[Any], decode: Any, tokens: int) -> list[Any]:
        """The batcher's outputs for this request's inputs; the request is dropped from the queue if
        its client disconnects while it waits (the slot goes to the next)."""
        waiting = asyncio.ensure_future(state["batcher"].submit(inputs, decode, tokens))
        try:
            while not waiting.done():
                await asyncio.wait({waiting}, timeout=DISCONNECT_POLL_S)
                if not waiting.done() and await request.is_disconnected():
                    waiting.cancel()
                    raise RequestError(499, "client_gone", "the client disconnected")
            return waiting.result()
        except QueueFullError as full:
            raise RequestError(503, "queue_full", str(full),
                               {"Retry-After": str(settings.retry_after_s)}) from None  # fmt: skip
        except RequestError:
            raise
        except asyncio.CancelledError:  # uvicorn cuts off what is left past the grace period of a SIGTERM
            raise RequestError(503, "shutting_down", "the server stopped before this request's turn came",
                               {"Retry-After": str(settings.retry_after_s)}) from None  # fmt: skip
        except Exception as error:  # the model failed on this request's inputs: this request fails alone
            raise RequestError(500, "model_error", f"{type(error).__name__}: {error}") from None
        finally:  # answered, refused, or cut off (a server past its grace period): out of the queue
            waiting.cancel()

    @app.get("/health")
    async def health() -> JSONResponse:
        if state["failed"]:
            return JSONResponse({"status": "failed", "error": state["failed"]}, status_code=503)
        if state["model"] is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/info")
    async def info() -> dict:
        model = ready_model()
        return {"attnkit": version("attnkit"), "checkpoint": str(model.checkpoint), **model.describe(),
                "serve": dataclasses.asdict(settings) | {"api_key": bool(settings.api_key)}}  # fmt: skip

    @app.get("/metrics")
    async def prometheus() -> Response:
        batcher = state["batcher"]
        metrics.queue.set(batcher.waiting() if batcher else 0)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/explore")
    async def explore(text: str = "", target: str | None = None) -> HTMLResponse:
        """The attention explorer (``attnkit explore``'s page) on ``text``: every layer and head; run
        while no batch runs (it hooks the model)."""
        model: ServedModel = ready_model()
        page = await state["batcher"].alone(model.explore, text, target or None, "/explore")
        if page is None:
            raise RequestError(404, "not_available", f"the attention explorer needs attnkit's engine; "
                               f"this server runs {model.engine}")  # fmt: skip
        return HTMLResponse(page[0], status_code=page[1])

    if kind == "predict":
        _prediction_route(app, ready_model, check_lengths, answered)
    elif kind == "generate":
        generation_routes(app, ready_model, check_lengths, answered, RequestError)
    else:
        _translation_route(app, ready_model, check_lengths, answered, metrics)
    return app


def _translation_route(app: FastAPI, ready_model: Callable, check_lengths: Callable, answered: Callable,
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
        tokens = translator.tokens(texts)
        check_lengths(tokens, translator.max_source_tokens, "src")
        found = await answered(request, texts, (beam, n_best), sum(tokens))
        results = []
        for text, best in zip(texts, found, strict=True):
            for target, score in best:
                metrics.output_tokens.inc(translator.output_tokens(target))
                results.append({"src": text, "tgt": target, "pred_score": score, "n_best": n_best})
        return [results]


class PredictBody(BaseModel):
    """``{"inputs": [...]}``: sentences (a classifier; a masked-LM's with its mask token), or
    ``question<TAB>passage`` (question answering), as ``attnkit predict`` reads them."""

    inputs: list[str] = Field(min_length=1)


def _prediction_route(
    app: FastAPI, ready_model: Callable, check_lengths: Callable, answered: Callable
) -> None:
    """``POST /predict``, for encoder models (classification, question answering, masked-LM)."""

    @app.post("/predict")
    async def predict(request: Request, body: PredictBody) -> dict:
        predictor: Predictor = ready_model()
        problem = predictor.problem(body.inputs)
        if problem:
            raise RequestError(422, "invalid_request", problem)
        tokens = predictor.tokens(body.inputs)
        check_lengths(tokens, predictor.max_tokens, "inputs")
        lines = await answered(request, body.inputs, None, sum(tokens))
        return {"outputs": [predictor.as_json(line) for line in lines]}


class CountAndGuard:
    """ASGI middleware: every request counted (by endpoint and status, in progress, latency) and, with
    an API key, refused without it (but ``/health``). Plain ASGI rather than Starlette's
    ``BaseHTTPMiddleware``, under which a handler cannot see its client disconnect."""

    def __init__(self, app: Any, settings: ServeSettings, metrics: Metrics) -> None:
        self.app, self.settings, self.metrics = app, settings, metrics

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint, began, status = scope["path"], time.perf_counter(), [500]
        key = self.settings.api_key
        if (
            key
            and endpoint != "/health"
            and dict(scope["headers"]).get(b"authorization") != f"Bearer {key}".encode()
        ):
            self.metrics.errors.labels("unauthorized").inc()
            self.metrics.requests.labels(endpoint, "401").inc()
            refusal = RequestError(401, "unauthorized", "this server needs 'Authorization: Bearer KEY'")
            await _error(refusal)(scope, receive, send)
            return

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        with self.metrics.in_progress.labels(endpoint).track_inprogress():
            await self.app(scope, receive, sending)
        self.metrics.requests.labels(endpoint, str(status[0])).inc()
        self.metrics.latency.labels(endpoint).observe(time.perf_counter() - began)


def _error(error: RequestError) -> JSONResponse:
    return JSONResponse({"error": str(error), "kind": error.kind}, status_code=error.status,
                        headers=error.headers)  # fmt: skip
