"""A load generator's HTTP client that costs little: one HTTP/1.1 keep-alive connection per client,
each request written whole in one call and its answer read by its ``Content-Length``.

Why: the load generator shares the machine with the server it measures. httpx's ``AsyncClient``
spent about 2 ms of CPU on each request and its answer (``bench/serve_load.py`` at one client: 0.09
of a core for 40 requests/s), which is time on the clock of every latency measured and, at 32 clients,
a quarter of a core the servers did not get. This client does only what a closed loop of JSON POSTs
needs (no redirects, no chunked answers, no TLS, no pools), so that what is measured is the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import urlsplit


class KeepAlive:
    """One connection to ``url``'s host, reopened when the server closes it; :meth:`post` sends a JSON
    body to ``url``'s path and returns the status and the parsed JSON answer (None if not JSON), or
    raises ``asyncio.TimeoutError`` after ``timeout_s`` without one (and closes the connection)."""

    def __init__(self, url: str, timeout_s: float = 120) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/"
        self.timeout_s = timeout_s
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, payload: Any) -> tuple[int, Any]:
        try:
            return await asyncio.wait_for(self._exchange(payload), self.timeout_s)
        except asyncio.TimeoutError:  # (TimeoutError itself from Python 3.11)
            await self.close()
            raise

    async def _exchange(self, payload: Any) -> tuple[int, Any]:
        body = json.dumps(payload).encode()
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        for fresh in (self.writer is None, True):  # a kept connection once, then a new one
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            assert self.reader is not None
            try:
                self.writer.write(head + body)
                status_line = await self.reader.readline()
            except ConnectionResetError:
                status_line = b""
            if status_line:
                break
            # closed before any answer: a kept connection the server let go while it was idle (uvicorn
            # closes one after 5 s) never saw the request, so it goes again on a new one
            await self.close()
            if fresh:
                raise ConnectionError(f"{self.host}:{self.port} closed the connection before answering")
        status, length, closing = int(status_line.split()[1]), 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                raise ValueError("a chunked answer: this client reads Content-Length bodies only")
            elif name == b"connection" and value.strip().lower() == b"close":
                closing = True
        answer = await self.reader.readexactly(length)
        if closing:
            await self.close()
        try:
            return status, json.loads(answer)
        except ValueError:
            return status, None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):  # (gone already)
                await self.writer.wait_closed()
        self.reader = self.writer = None
