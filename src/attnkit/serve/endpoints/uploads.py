"""The endpoints of a model that reads uploaded files (serve/served.py's ``ReadsUploads``: a captioner
reads images, a speech recogniser WAV files), the files sent as ``multipart/form-data`` in fields named
as the model says (``curl -F image=@scene.png``, ``curl -F audio=@hello.wav``):

- ``POST /predict``: one or more files -> ``{"outputs": [{"caption": ...}]}`` (or ``"transcript"``), one
  per file in their order, what ``attnkit predict --image`` (``--audio``) prints for them;
- ``POST /explore``: one file -> the model's explorer page (the caption explorer: each word over where
  the captioner looked; the speech explorer: the spectrogram, each character over the frames it
  attended), with the upload form again; ``GET /explore`` gives the form.

Each file's header is read here (what it is, how large: so what it costs) and nothing more; the file is
decoded (pixels, features) on the batcher's worker, once the request has its place in the queue, so
that ``--max-queue`` bounds the uploads being decoded as it bounds every other request. A body that is
not a form of uploads is a 415 saying how to send one, a form that cannot be read a 400 saying why; a
form without a file in the model's field, or a file the model cannot read (no PNG or JPEG, or not of its
size; not a WAV file of PCM samples at 8 to 96 kHz, or too short), a 422 naming it; files that cost more
than ``--max-batch-tokens`` (counted in the model's unit: regions, annotations) or ``--max-batch-positions``,
a 413, and a file that costs the explorer more than ``--max-explore-tokens``, a 413 too.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from starlette.exceptions import HTTPException

from attnkit.errors import DataError
from attnkit.serve.errors import RequestError
from attnkit.serve.served import ReadsUploads
from attnkit.serve.state import ServerState, server_of

router = APIRouter()
MAX_FILES = 256  # files in one request at most


@router.post("/predict")
async def predict(request: Request) -> dict:
    server = server_of(request)
    model: ReadsUploads = server.ready_model()
    uploads = [upload for _, upload in await _uploaded(request, model)]
    costs = [model.cost(upload) for upload in uploads]
    server.check_lengths(costs, None, model.field, model.unit)
    positions = model.positions(costs, None)
    server.check_positions(positions)
    outputs = await server.batched(request, uploads, None, sum(costs), positions)
    return {"outputs": [{model.output: text} for text in outputs]}


@router.post("/explore")
async def explore(request: Request) -> HTMLResponse:
    server = server_of(request)
    model: ReadsUploads = server.ready_model()
    uploads = await _uploaded(request, model)
    if len(uploads) != 1:
        said = f"{model.field}: {len(uploads)} files; the explorer shows one"
        raise RequestError(422, "invalid_request", said)
    ((name, upload),) = uploads
    _check_explorable(server, model, model.cost(upload))
    assert server.batcher is not None
    asked = server.batcher.alone(model.explore_upload, upload, name, "/explore")
    return HTMLResponse(await server.answered(request, asked))


def _check_explorable(server: ServerState, model: ReadsUploads, cost: int) -> None:
    """413 for a file that costs more than a batch may hold, or than the explorer shows (its page grows
    with the file: a spectrogram's frames, an alignment's rows)."""
    server.check_lengths([cost], None, model.field, model.unit)
    limit = server.settings.max_explore_tokens
    if cost > limit:
        message = (
            f"{model.field}: {cost} {model.unit}, more than the explorer's {limit} (--max-explore-tokens)"
        )
        raise RequestError(413, "too_long", message)


async def _uploaded(request: Request, model: ReadsUploads) -> list[tuple[str, Any]]:
    """Each file uploaded in ``request``'s fields named ``model.field``, with its name, its header read
    by the model (off the event loop)."""
    field = model.field
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        said = f"this model {model.reads}: upload them as multipart/form-data fields named {field}"
        raise RequestError(415, "unsupported_media_type", f"{said} ({model.example})")
    try:
        async with request.form(max_files=MAX_FILES, max_fields=MAX_FILES) as form:
            uploads = [part for part in form.getlist(field) if not isinstance(part, str)]
            if not uploads:
                raise RequestError(
                    422, "invalid_request", f"{field}: no file uploaded in a field named {field}"
                )
            files = [
                (upload.filename or f"{field}.{i}", await upload.read()) for i, upload in enumerate(uploads)
            ]
    except HTTPException as error:  # Starlette's refusal of a form it cannot parse
        raise RequestError(
            400, "malformed_form", f"body: not a multipart form this reads ({error.detail})"
        ) from None
    return await asyncio.to_thread(_read_all, files, model)


def _read_all(files: list[tuple[str, bytes]], model: ReadsUploads) -> list[tuple[str, Any]]:
    uploads = []
    for name, data in files:
        try:
            uploads.append((name, model.read_upload(data, name)))
        except DataError as error:
            raise RequestError(422, "invalid_request", f"{model.field}: {error}") from None
    return uploads
