"""Every error the server sends, in one format: ``{"error": "...", "kind": "..."}``, naming what was wrong.

A request the server refuses raises :class:`RequestError` (status, kind, message); the handlers here turn
it, pydantic's validation errors, Starlette's own refusals (an unknown path, a wrong method, a body
FastAPI cannot parse) and any bug into that format, and count each by kind in ``/metrics``. None stops
the server. Every bound and its error is listed in docs/serving.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from attnkit.serve.metrics import Metrics

KIND_OF_STATUS = {404: "not_found", 405: "method_not_allowed"}  # Starlette's refusals, by status
MALFORMED_JSON = "the request body is not JSON in UTF-8 (or nests too deep)"
NOT_JSON = "the request body is not valid JSON"


class RequestError(Exception):
    """A request the server refuses with ``status`` and a message (not a failure of the server)."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, headers or {}


def error_response(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """Every error the server sends: ``{"error": message, "kind": kind}``."""
    return JSONResponse({"error": message, "kind": kind}, status_code=status, headers=headers)


def refusal(error: RequestError, metrics: Metrics) -> JSONResponse:
    """The answer to a refused request, counted by its kind."""
    metrics.errors.labels(error.kind).inc()
    return error_response(error.status, error.kind, str(error), error.headers)


def handle_errors(app: FastAPI, metrics: Metrics) -> None:
    """Answer every refusal and failure of ``app`` in the server's format, counted by kind."""

    @app.exception_handler(RequestError)
    async def refused(request: Request, error: RequestError) -> JSONResponse:
        return refusal(error, metrics)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return await refused(request, _validation_error(error))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return await refused(request, _starlette_error(request, error))

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception) -> JSONResponse:
        """A bug: JSON like every other error (the traceback goes to the log, not to the client)."""
        metrics.errors.labels("internal_error").inc()
        message = f"the server failed on this request ({type(error).__name__})"
        return error_response(500, "internal_error", message)


def _validation_error(error: RequestValidationError) -> RequestError:
    """FastAPI's complaint about a body it checked (its fields' places start with ``body``)."""
    problems = error.errors()
    if any(problem.get("type") == "json_invalid" for problem in problems):
        return RequestError(400, "malformed_json", NOT_JSON)
    return invalid_body([{**problem, "loc": problem.get("loc", ())[1:]} for problem in problems])


def invalid_body(problems: Sequence[Mapping[str, Any]]) -> RequestError:
    """pydantic's first complaint about a body, naming its field (``0.src: Input should be a valid
    string``)."""
    first = problems[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "body"
    return RequestError(422, "invalid_request", f"{where}: {first.get('msg', 'invalid')}")


def _starlette_error(request: Request, error: HTTPException) -> RequestError:
    """An unknown path, a wrong method, or (400) a body FastAPI could not parse: not UTF-8, or nested
    too deep."""
    if error.status_code == 400:
        return RequestError(400, "malformed_json", MALFORMED_JSON)
    kind = KIND_OF_STATUS.get(error.status_code, "http_error")
    return RequestError(error.status_code, kind, f"{request.url.path}: {error.detail}", error.headers)
