"""What the server's app costs per request, in its own process: the CPU of ``attnkit serve``'s app for
one translate request (its middleware, the endpoint's checks, tokenising, JSON), with no model and no
network, against a plain FastAPI endpoint taking the same body.

At 32 clients the server's process shares two cores with the engines, so every microsecond its Python
spends on a request is one the engines do not get. ``bench/serve_load.py`` prints the server's share of
the cores under load; this isolates the app from uvicorn's protocol and from the engines: the app is
called as uvicorn calls it (an ASGI scope, the body, a ``send`` that keeps what it is given), one request
after another on one event loop, the batcher a stub that answers at once with a fixed translation. The
peer is what FastAPI's documentation writes: an endpoint that takes ``list[TranslateItem]`` (the same
pydantic model) and returns the same answer as a list of dicts, which FastAPI checks and encodes. Both
tokenise nothing but what the app itself does (the peer none: what it costs is FastAPI's own floor).

``python bench/app_cost.py --ckpt RUN`` (a translation checkpoint: its tokenizer and limits; the model
is loaded, never run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnkit.decode.search import Translation
from attnkit.serve.bodies import TranslateItem  # the peer's body (FastAPI reads its annotation by name)

SENTENCE = "Ein Mann in einem blauen Hemd steht auf einer Leiter und putzt ein Fenster."
ANSWER = "A man in a blue shirt is standing on a ladder cleaning a window."


class AnsweringAtOnce:
    """A batcher whose every request is done as soon as it is submitted."""

    def submit(self, inputs: list[str], settings: Any, tokens: int, positions: int) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        answer = Translation(ANSWER, -0.5, 16)  # (its token count a stand-in)
        future.set_result([[answer] * settings.n_best for _ in inputs])
        return future


def attnkit_app(ckpt: Path) -> Any:
    """``attnkit serve``'s app for the translator at ``ckpt``, serving at once (no lifespan, no load)."""
    from attnkit.serve.app import make_app
    from attnkit.serve.state import ServeSettings
    from attnkit.serve.translator import ServedTranslator

    model = ServedTranslator.load(ckpt, [])
    app = make_app(ServedTranslator, lambda: model, ServeSettings(batching="continuous"))
    app.state.server.model, app.state.server.batcher = model, AnsweringAtOnce()
    return app


def plain_fastapi_app() -> Any:
    """The peer: the endpoint as FastAPI's tutorial writes it, the same body model and answer."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/translator/translate")
    async def translate(items: list[TranslateItem]) -> list[list[dict]]:
        return [[{"src": item.src, "tgt": ANSWER, "pred_score": -0.5, "n_best": 1} for item in items]]

    return app


async def call(app: Any, body: bytes) -> list[dict]:
    """One ``POST /translator/translate`` through ``app``, as uvicorn makes it; what the app sent."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/translator/translate", "raw_path": b"/translator/translate",
        "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
        "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
    }  # fmt: skip
    sent: list[dict] = []
    read, never = False, asyncio.Event()

    async def receive() -> dict:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the client stays (an app watching for its disconnect waits here)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def answer_of(sent: list[dict]) -> tuple[int, Any]:
    return sent[0]["status"], json.loads(b"".join(message.get("body", b"") for message in sent[1:]))


async def cpu_per_request(app: Any, body: bytes, requests: int, repeats: int) -> float:
    """The median over ``repeats`` of the app's CPU (this process's) per request, in µs, after a warm-up."""
    for _ in range(200):
        await call(app, body)
    runs = []
    for _ in range(repeats):
        began = time.process_time()
        for _ in range(requests):
            await call(app, body)
        runs.append((time.process_time() - began) / requests * 1e6)
    return statistics.median(runs)


def event_loop_runner() -> Callable:
    """uvicorn's event loop where it is installed (uvloop, as ``attnkit serve`` runs), else asyncio's."""
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        return asyncio.run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", type=Path, required=True, help="a translation checkpoint or run directory")
    parser.add_argument("--requests", type=int, default=3000, help="requests in one timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs (the median is printed)")
    args = parser.parse_args()

    body = json.dumps([{"src": SENTENCE}]).encode()
    apps = {"attnkit serve's app": attnkit_app(args.ckpt), "plain FastAPI endpoint": plain_fastapi_app()}
    run = event_loop_runner()
    print(f"one POST /translator/translate of one sentence, {args.requests} requests x {args.repeats} runs, "
          f"in process, one event loop ({run.__module__}), the batcher answering at once")  # fmt: skip
    costs = {}
    for name, app in apps.items():
        status, answer = answer_of(run(call(app, body)))
        assert status == 200 and answer[0][0]["tgt"] == ANSWER, (name, status, answer)
        costs[name] = run(cpu_per_request(app, body, args.requests, args.repeats))
        print(f"{name}: {costs[name]:.0f} µs of CPU per request (median of {args.repeats})")
    ours, peer = costs.values()
    print(f"attnkit serve's app / plain FastAPI endpoint CPU per request: {ours / peer:.2f}")


if __name__ == "__main__":
    main()
