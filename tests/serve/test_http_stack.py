"""What the server spends per request outside the model: uvicorn runs on uvloop and httptools where
``attnkit[serve]`` installed them (else one line says what asyncio's loop and h11 cost), and a short
request is tokenised on the event loop rather than through a thread."""

import asyncio
import importlib.util

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs FastAPI: pip install 'attnkit[serve]'")
uvicorn = pytest.importorskip("uvicorn", reason="attnkit serve needs uvicorn: pip install 'attnkit[serve]'")

from attnkit.cli.serving import http_stack  # noqa: E402
from attnkit.serve import state  # noqa: E402
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
