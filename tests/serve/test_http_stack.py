"""What the server spends per request outside the model: uvicorn runs on uvloop and httptools where
``attnkit[serve]`` installed them (else one line says what asyncio's loop and h11 cost), and a short
request is tokenised on the event loop rather than through a thread; a waiting request hears its client
go at once, with no polling."""

import asyncio
import importlib.util
import re
import socket
import time

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs FastAPI: pip install 'attnkit[serve]'")
uvicorn = pytest.importorskip("uvicorn", reason="attnkit serve needs uvicorn: pip install 'attnkit[serve]'")

from fastapi import FastAPI, Request  # noqa: E402

from attnkit.cli.serving import http_stack  # noqa: E402
from attnkit.serve import state  # noqa: E402
from attnkit.serve.errors import RequestError  # noqa: E402
from attnkit.serve.state import INLINE_CHARACTERS, ServerState, ServeSettings  # noqa: E402


async def _app(scope, receive, send) -> None:  # an ASGI app that uvicorn's Config can load
    pass


def test_the_server_runs_uvloop_and_httptools_which_the_serve_extra_installs():
    heard: list[str] = []
    config = uvicorn.Config(_app, **http_stack(heard.append))
    config.load()
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"
    import uvloop

    assert config.get_loop_factory() is uvloop.new_event_loop
    assert heard == []


def test_without_them_the_server_runs_asyncio_and_h11_and_one_line_says_what_it_costs(monkeypatch):
    found = importlib.util.find_spec
    without_httptools = lambda name: None if name == "httptools" else found(name)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", without_httptools)
    heard: list[str] = []
    assert http_stack(heard.append) == {"loop": "asyncio", "http": "h11"}
    (line,) = heard
    assert line.startswith("httptools not installed") and "1.3 times the CPU per request" in line
    config = uvicorn.Config(_app, **http_stack(heard.append))
    config.load()
    assert config.http_protocol_class.__name__ == "H11Protocol"


class _Tokens:
    def tokens(self, texts: list[str]) -> list[int]:
        return [len(text.split()) for text in texts]


def test_a_short_request_is_tokenised_on_the_event_loop_and_a_long_one_in_a_thread(monkeypatch):
    hops: list[list[str]] = []
    to_thread = asyncio.to_thread

    async def counted_hop(function, texts):
        hops.append(texts)
        return await to_thread(function, texts)

    monkeypatch.setattr(state.asyncio, "to_thread", counted_hop)
    server, model = ServerState(ServeSettings()), _Tokens()
    short = ["ein Mann fährt Fahrrad", "zwei Hunde"]
    long = ["wort " * (INLINE_CHARACTERS // 5 + 1)]
    assert asyncio.run(server.token_counts(model, short)) == [4, 2]
    assert hops == []
    assert asyncio.run(server.token_counts(model, long)) == [INLINE_CHARACTERS // 5 + 1]
    assert hops == [long]


async def _serve_and_disconnect(http: str) -> tuple[float, int]:
    """A real uvicorn server (``http``: its protocol) whose one endpoint waits, through
    ``ServerState.answered``, for work that never ends; a client sends it a request and goes 0.1 s later.
    Returns how long after the client went the endpoint heard it, and the answer to a request whose work
    is done at once."""
    server_state, heard = ServerState(ServeSettings()), asyncio.get_running_loop().create_future()
    app = FastAPI()

    @app.post("/wait")
    async def wait(request: Request) -> None:
        try:
            await server_state.answered(request, asyncio.get_running_loop().create_future())  # never done
        except RequestError as error:
            heard.set_result((error.status, time.perf_counter()))
            raise

    @app.post("/now")
    async def now(request: Request) -> int:
        done = asyncio.get_running_loop().create_future()
        done.set_result(7)
        return await server_state.answered(request, done)

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    served = uvicorn.Server(uvicorn.Config(app, http=http, loop="none", log_level="error", lifespan="off"))
    serving = asyncio.ensure_future(served.serve(sockets=[listening]))
    while not served.started:
        await asyncio.sleep(0.01)
    try:
        head = f"HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 2\r\n\r\n{{}}"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"POST /now {head}".encode())
        answer = await reader.readuntil(b"\r\n\r\n")  # its head, then its body (maybe sent apart)
        length = re.search(rb"content-length: (\d+)", answer, re.IGNORECASE)
        answer += await reader.readexactly(int(length[1]) if length else 0)
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"POST /wait {head}".encode())
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.close()
        went = time.perf_counter()
        status, at = await asyncio.wait_for(heard, timeout=5)
        assert status == 499
        return at - went, answer
    finally:
        served.should_exit = True
        await serving
        listening.close()


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_a_waiting_request_hears_its_client_go_at_once_and_an_answered_one_is_answered(http):
    """``ServerState.answered`` waits for the answer or the client's disconnect, whichever comes first,
    on uvicorn's own ``receive`` (no polling): the request is dropped within milliseconds of its client
    going, where a check every quarter of a second took up to 0.25 s (here 0.15)."""
    pytest.importorskip(http)
    after, answer = asyncio.run(_serve_and_disconnect(http))
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"7")
    assert after < 0.08, f"the endpoint heard its client go {after:.3f} s after it went"
