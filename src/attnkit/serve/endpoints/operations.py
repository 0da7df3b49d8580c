"""What an operator asks every server: ``/health`` (an orchestrator's probe, never behind the API key),
``/info`` (the model and the server's settings), ``/metrics`` (Prometheus text)."""

from __future__ import annotations

import dataclasses
from importlib.metadata import version

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from attnkit.serve.state import server_of

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 ``ready`` once the model serves; 503 ``loading`` before it, ``failed`` if it could not load
    (or a new worker process could not start in place of one that failed), and ``stalled`` while any
    worker's requests have waited or run ``--stall-after`` seconds with no batch starting or ending, or
    no step of its running batch (a server that has stopped making progress). A translator's ``steps``
    say what its searches step with: ``compiled``, ``eager``, or ``compiling`` while its compiled steps
    are built (the model's own serve meanwhile)."""
    server = server_of(request)
    failed = server.failed or (server.batcher.broken if server.batcher is not None else None)
    if failed:
        return JSONResponse({"status": "failed", "error": failed}, status_code=503)
    if server.batcher is None:
        return JSONResponse({"status": "loading"}, status_code=503)
    stalled = server.batcher.stalled_for()
    if stalled > server.settings.stall_after_s:
        said = f"requests have waited or run {stalled:.0f} s without a batch or a step ending"
        return JSONResponse({"status": "stalled", "error": said}, status_code=503)
    steps = server.steps()
    return JSONResponse({"status": "ready"} | ({"steps": steps} if steps is not None else {}))


@router.get("/info")
async def info(request: Request) -> dict:
    """What a client needs to know of the model and the server (no paths of the server's machine)."""
    server = server_of(request)
    model = server.ready_model()
    settings = dataclasses.asdict(server.settings) | {"api_key": bool(server.settings.api_key)}
    return {"attnkit": version("attnkit"), "checkpoint": model.checkpoint.name, **model.describe(),
            "serve": settings}  # fmt: skip


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    server = server_of(request)
    server.metrics.queue.set(server.batcher.waiting() if server.batcher else 0)
    return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)
