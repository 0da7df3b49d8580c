"""What every HTTP request passes before it reaches an endpoint: counted, and guarded.

Two plain ASGI middlewares (not Starlette's ``BaseHTTPMiddleware``, under which a handler cannot see its
client disconnect):

- :class:`CountRequests`, the outer one: every request counted by endpoint and status, in progress, and
  its latency. Endpoints are labelled by route, and every path the server does not serve by one label,
  ``unmatched``, so that clients asking for random paths cannot grow ``/metrics`` without bound.
- :class:`Guard`, inside it: a request is refused before any of it is parsed when its ``Host`` header
  names another server (a server on 127.0.0.1 answers only to the loopback names, so a web page cannot
  reach it through DNS rebinding), when it lacks the API key (every endpoint but ``/health``), or when
  its body is larger than ``max_body_bytes`` (413 at once from ``Content-Length``, or as soon as a body
  sent without one grows past it: no body is held whole in memory before its size is known).
- :class:`Direct`, inside both: the handlers that read their own request and make their own response
  (``endpoints.DIRECT``: the translate endpoint, the server's hot path) are called straight from here,
  past FastAPI's routing, its solving of a handler's parameters and its exception middleware (a third
  of the app's CPU for such a request); they stay FastAPI routes, which ``/openapi.json`` describes,
  and a refusal they raise gets the format and count every refusal gets (``errors.refusal``); a bug,
  the 500 of every bug (the outermost middleware's handler).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from attnkit.serve.errors import RequestError, error_response, refusal
from attnkit.serve.metrics import Metrics

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
Handler = Callable[[Request], Awaitable[Response]]

UNMATCHED = "unmatched"  # the endpoint label of every path the server does not serve
OPEN = frozenset({"/health"})  # endpoints that need no API key (an orchestrator's probe)


class CountRequests:
    """Counts every request (see the module docstring); ``routes`` are the paths the server serves."""

    def __init__(self, app: Any, metrics: Metrics, routes: frozenset[str]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = scope["path"] if scope["path"] in self.routes else UNMATCHED
        began, status = time.perf_counter(), [500]

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        with self.metrics.in_progress.labels(endpoint).track_inprogress():
            await self.app(scope, receive, sending)
        self.metrics.requests.labels(endpoint, str(status[0])).inc()
        self.metrics.latency.labels(endpoint).observe(time.perf_counter() - began)


class Guard:
    """Refuses what must not reach an endpoint (see the module docstring). ``hosts``: the ``Host``
    names accepted (empty: any); ``api_key``: the key every endpoint but ``/health`` needs (empty:
    none)."""

    def __init__(
        self, app: Any, metrics: Metrics, api_key: str, max_body_bytes: int, hosts: tuple[str, ...]
    ) -> None:
        self.app, self.metrics, self.max_body_bytes, self.hosts = app, metrics, max_body_bytes, hosts
        self.expected = f"Bearer {api_key}".encode() if api_key else b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        refusal = self._refusal(scope["path"], headers)
        if refusal is None and scope["method"] not in ("GET", "HEAD"):
            body, refusal = await self._body(headers, receive)
            receive = _replaying(body, receive)
        if refusal is not None:
            self.metrics.errors.labels(refusal[1]).inc()
            await error_response(*refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, path: str, headers: dict[bytes, bytes]) -> tuple[int, str, str] | None:
        if self.hosts and _host_name(headers.get(b"host", b"")) not in self.hosts:
            return 400, "wrong_host", f"this server answers to {', '.join(self.hosts)} only"
        if self.expected and path not in OPEN and not _key_matches(headers, self.expected):
            return 401, "unauthorized", "this server needs 'Authorization: Bearer KEY'"
        length = headers.get(b"content-length", b"0")
        if not length.isdigit():
            return 400, "malformed_request", "the Content-Length header is not a number"
        if int(length) > self.max_body_bytes:
            return 413, "too_large", self._too_large(int(length))
        return None

    def _too_large(self, size: int | None) -> str:
        said = f"{size:,} bytes" if size is not None else "a body"
        return f"body: {said}, more than the server's --max-body-bytes {self.max_body_bytes:,}"

    async def _body(self, headers: dict, receive: Receive) -> tuple[bytes, tuple[int, str, str] | None]:
        """The body, read while it stays within the limit (a refusal as soon as it does not)."""
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"", (499, "client_gone", "the client disconnected while sending its body")
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > self.max_body_bytes:
                return b"", (413, "too_large", self._too_large(None))
            if not message.get("more_body", False):
                return b"".join(parts), None


class Direct:
    """Calls the handlers of ``routes`` (by method and path) straight from here (see the module
    docstring); every other request goes on to FastAPI."""

    def __init__(self, app: Any, metrics: Metrics, routes: dict[tuple[str, str], Handler]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.routes.get((scope["method"], scope["path"])) if scope["type"] == "http" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await handler(Request(scope, receive, send))
        except RequestError as error:
            response = refusal(error, self.metrics)
        await response(scope, receive, send)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body already read, then whatever the client sends next (its
    disconnect, which the endpoints watch for)."""
    given = False

    async def replay() -> dict:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _key_matches(headers: dict[bytes, bytes], expected: bytes) -> bool:
    """Whether the ``Authorization`` header holds the key, compared in constant time (no timing tells
    how much of a guess was right); the scheme's case does not matter (RFC 9110, 11.1)."""
    given = headers.get(b"authorization", b"")
    scheme, _, key = given.partition(b" ")
    return hmac.compare_digest(b"Bearer " + key if scheme.lower() == b"bearer" else given, expected)


def _host_name(host: bytes) -> str:
    """The name of a ``Host`` header without its port (``[::1]:8000`` -> ``[::1]``)."""
    text = host.decode("latin-1").lower()
    if text.startswith("["):
        return text.partition("]")[0] + "]"
    return text.rpartition(":")[0] if ":" in text else text
