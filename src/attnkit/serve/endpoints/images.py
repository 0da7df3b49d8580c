"""A captioner's endpoints, images uploaded as ``multipart/form-data`` (``curl -F image=@scene.png``):

- ``POST /predict``: one or more files in fields named ``image`` -> ``{"outputs": [{"caption": ...}]}``,
  one per image in their order, what ``attnkit predict --image`` prints for them;
- ``POST /explore``: one ``image`` -> the caption explorer's page (each word over where the captioner
  looked), with the upload form again; ``GET /explore`` gives the form.

An upload that is no image, or not of the model's size, is a 422 naming it; a body that is not a form of
uploads is a 415 saying how to send one.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from torch import Tensor

from attnkit.data.images import check_image_size, grey_image_from_bytes
from attnkit.errors import DataError
from attnkit.serve.captioner import ServedCaptioner
from attnkit.serve.errors import RequestError
from attnkit.serve.state import server_of

router = APIRouter()
MAX_IMAGES = 256  # files in one request at most


@router.post("/predict")
async def predict(request: Request) -> dict:
    server = server_of(request)
    captioner: ServedCaptioner = server.ready_model()
    images = [image for _, image in await _uploaded_images(request, captioner)]
    server.check_lengths([captioner.regions] * len(images), captioner.regions, "image")
    captions = await server.batched(request, images, None, captioner.regions * len(images))
    return {"outputs": [{"caption": text} for text in captions]}


@router.post("/explore")
async def explore(request: Request) -> HTMLResponse:
    server = server_of(request)
    captioner: ServedCaptioner = server.ready_model()
    images = await _uploaded_images(request, captioner)
    if len(images) != 1:
        raise RequestError(422, "invalid_request", f"image: {len(images)} files; the explorer shows one")
    ((name, image),) = images
    assert server.batcher is not None
    asked = server.batcher.alone(captioner.explore_image, image, name, "/explore")
    return HTMLResponse(await server.answered(request, asked))


async def _uploaded_images(request: Request, captioner: ServedCaptioner) -> list[tuple[str, Tensor]]:
    """The images uploaded in ``request``'s fields named ``image``, each read and checked (see the module
    docstring), with its file's name."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise RequestError(
            415, "unsupported_media_type",
            "a captioner reads images: upload them as multipart/form-data fields named image "
            "(curl -F image=@scene.png)",
        )  # fmt: skip
    async with request.form(max_files=MAX_IMAGES, max_fields=MAX_IMAGES) as form:
        uploads = [field for field in form.getlist("image") if not isinstance(field, str)]
        if not uploads:
            raise RequestError(422, "invalid_request", "image: no file uploaded in a field named image")
        files = [(upload.filename or f"image.{i}", await upload.read()) for i, upload in enumerate(uploads)]
    return await asyncio.to_thread(_read, files, captioner.image_size)


def _read(files: list[tuple[str, bytes]], size: int) -> list[tuple[str, Tensor]]:
    images = []
    for name, data in files:
        try:
            image = grey_image_from_bytes(data, name)
            check_image_size(image, size, name)
        except DataError as error:
            raise RequestError(422, "invalid_request", f"image: {error}") from None
        images.append((name, image))
    return images
