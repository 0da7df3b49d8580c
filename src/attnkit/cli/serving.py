"""``attnkit serve``: one trained model behind HTTP (attnkit/serve/), on uvicorn."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from attnkit.cli.loading import check_engine
from attnkit.cli.shared import (
    EXTRA_ARGS,
    Engine,
    Int8,
    Precision,
    app,
    at_least,
    decode_overrides,
    note,
    one_line_errors,
    precision_override,
)
from attnkit.errors import AttnkitError

if TYPE_CHECKING:
    from attnkit.serve.served import ServedModel
    from attnkit.serve.state import ServeSettings

API_KEY_VARIABLE = "ATTNKIT_API_KEY"
BATCHINGS = ("auto", "continuous", "batches")
WORKERS = ("processes", "threads")


# the server's options, declared once here so that the command's signature reads as a list
Checkpoint = Annotated[
    Path,
    typer.Option(
        help="Checkpoint folder or run directory (its best checkpoint); with --engine ctranslate2, a "
        "folder from 'attnkit export --to ctranslate2'."
    ),
]
Host = Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every network).")]
Port = Annotated[int, typer.Option(help="Port to listen on.")]
MaxBatchTokens = Annotated[
    int, typer.Option(help="Source tokens in one batch at most (requests over it: 413).")
]
MaxBatchPositions = Annotated[
    int,
    typer.Option(
        help="Token positions the rows of one batch hold at most: each row its input and the longest "
        "output it may write (beam rows × (source + output bound); a prompt and its max_new_tokens). "
        "What admits requests by the memory and steps they take; a request over it: 413.",
    ),
]
MaxWaitMs = Annotated[
    float,
    typer.Option(
        help="How long a batch waits for more requests after its first (0: none; requests that come "
        "while the model is busy make up the next batch anyway). --batching batches only."
    ),
]
MaxQueue = Annotated[int, typer.Option(help="Requests waiting at most; more get 503.")]
ApiKey = Annotated[
    str,
    typer.Option(
        help=f"Require 'Authorization: Bearer KEY' on every endpoint but /health (default: "
        f"${API_KEY_VARIABLE}, else none).",
        show_default=False,
    ),
]
Grace = Annotated[
    float, typer.Option(help="SIGTERM: seconds to finish queued and running requests before exiting.")
]
MaxBodyBytes = Annotated[
    int, typer.Option(help="A request body's bytes at most (larger: 413 before it is read whole).")
]
MaxExploreTokens = Annotated[
    int,
    typer.Option(help="/explore: tokens of the text at most (more: 413); the page grows with their square."),
]
StallAfter = Annotated[
    float,
    typer.Option(
        help="Seconds requests may wait or run with no batch starting or ending before /health says "
        "'stalled' (503)."
    ),
]
Batching = Annotated[
    str,
    typer.Option(
        help="'continuous': requests join a running batch at its next step and leave it when done "
        "(translation, summarisation and decoder models on attnkit's engine); 'batches': a batch runs "
        "to its end while the next one gathers; 'auto': continuous where the model has a running "
        "batch, else batches.",
    ),
]
Workers = Annotated[
    str,
    typer.Option(
        help="Where continuous batching steps its running batches: 'processes', each in a process of its "
        "own that loads the model again (the server's Python and the steps' no longer take turns on one "
        "lock; the model's memory once more per worker); 'threads', on threads of the server's process. "
        "attnkit's engine on a CPU; elsewhere always threads.",
    ),
]
Allocator = Annotated[
    str,
    typer.Option(
        help="The memory allocator the worker processes start with (--workers processes, Linux): 'auto' "
        "takes tcmalloc, else jemalloc, else the system's malloc (a line in the log says which); with "
        "tcmalloc a running batch decoded ~15% faster than with glibc's malloc. 'tcmalloc', 'jemalloc' "
        "or 'system' to choose.",
    ),
]
AccessLog = Annotated[
    bool,
    typer.Option(
        help="A line in the log for every request (uvicorn's access log). Off by default: /metrics counts "
        "every request by endpoint and status with its latency, and each line takes the server's process "
        "CPU that the engines would otherwise have (about 15 µs).",
    ),
]


@app.command(context_settings=EXTRA_ARGS)
@one_line_errors
def serve(
    ctx: typer.Context,
    ckpt: Checkpoint,
    host: Host = "127.0.0.1",
    port: Port = 8000,
    engine: Engine = "attnkit",
    precision: Precision = None,
    int8: Int8 = False,
    max_batch_tokens: MaxBatchTokens = 4096,
    max_batch_positions: MaxBatchPositions = 65_536,
    max_wait_ms: MaxWaitMs = 0.0,
    max_queue: MaxQueue = 256,
    api_key: ApiKey = "",
    grace: Grace = 30.0,
    max_body_bytes: MaxBodyBytes = 1_048_576,
    max_explore_tokens: MaxExploreTokens = 64,
    stall_after: StallAfter = 300.0,
    batching: Batching = "auto",
    workers: Workers = "processes",
    allocator: Allocator = "auto",
    access_log: AccessLog = False,
) -> None:
    """Serve a trained model over HTTP, with concurrent requests batched together.

    A translation or summarisation model: POST /translator/translate in OpenNMT-py's format,
    [{"src": "..."}] (and beam_size, n_best). A decoder (GPT): POST /generate and /generate_stream
    (HF TGI's format) and /v1/completions (OpenAI's; "stream": true too). An encoder (classifier,
    question answering, masked-LM): POST /predict, {"inputs": ["..."]}. GET /health, /info,
    /metrics (Prometheus) and /explore (the attention explorer) too. The model loads once, after the
    server starts (/health says "loading" until then). Extra decode.field=value arguments change the
    run's decoding settings, as for 'attnkit translate' and 'generate'. SIGTERM (or Ctrl-C) stops
    accepting requests, finishes those queued and running, and exits. --engine ctranslate2 serves an
    exported translation model or decoder through the same endpoints and batching, searched by
    CTranslate2 (its int8: 'attnkit export --quantization int8'). Every option is checked, and the
    address taken, before the model loads."""
    if not 0 <= port <= 65535:
        raise AttnkitError(f"--port {port}: a port is a number from 0 to 65535")
    lowest = {"--max-batch-tokens": (max_batch_tokens, 1), "--max-batch-positions": (max_batch_positions, 1),
              "--max-wait-ms": (max_wait_ms, 0),
              "--max-queue": (max_queue, 1), "--grace": (grace, 0), "--max-body-bytes": (max_body_bytes, 1),
              "--max-explore-tokens": (max_explore_tokens, 1), "--stall-after": (stall_after, 1)}  # fmt: skip
    for option, (value, low) in lowest.items():
        at_least(option, value, low)
    check_engine(engine, precision, int8)
    overrides = decode_overrides(ctx) + precision_override(precision, int8)
    try:
        import uvicorn  # noqa: F401 (the server's, checked here: a missing one is one line)

        from attnkit.serve.choosing import attnkit_model, engine_model
        from attnkit.serve.state import ServeSettings
    except ImportError as error:
        raise AttnkitError(f"attnkit serve needs {error.name}: pip install 'attnkit[serve]'") from None
    key = api_key or os.environ.get(API_KEY_VARIABLE, "")
    if batching not in BATCHINGS:
        raise AttnkitError(f"--batching {batching}: choose one of {', '.join(BATCHINGS)}")
    if workers not in WORKERS:
        raise AttnkitError(f"--workers {workers}: choose one of {', '.join(WORKERS)}")
    from attnkit.cpu.allocator import ALLOCATORS

    if allocator not in ALLOCATORS:
        raise AttnkitError(f"--allocator {allocator}: choose one of {', '.join(ALLOCATORS)}")
    if engine == "ctranslate2":
        served, load = engine_model(ckpt, overrides, warn=note)
    else:
        served, load = attnkit_model(ckpt, overrides, warn=note)
    if batching == "continuous" and not served.steps_continuously:
        what = "CTranslate2's engine" if engine == "ctranslate2" else "this model"
        raise AttnkitError(f"--batching continuous: {what} has no running batch yet; use --batching batches")
    if batching == "auto":
        batching = "continuous" if served.steps_continuously else "batches"
    if batching == "continuous" and max_wait_ms > 0:
        raise AttnkitError(
            f"--max-wait-ms {max_wait_ms:g}: only batches wait for more requests (a running batch takes them "
            "at its next step); add --batching batches to wait"
        )
    listening = _listening_socket(host, port)  # before the model loads: a busy port is one line now
    # (worker processes are attnkit's running batches': continuous batching only)
    library = _allocator_library(allocator) if workers == "processes" and batching == "continuous" else None
    settings = ServeSettings(max_batch_tokens=max_batch_tokens, max_batch_positions=max_batch_positions,
                             max_wait_ms=max_wait_ms, max_queue=max_queue, api_key=key,
                             max_body_bytes=max_body_bytes, max_explore_tokens=max_explore_tokens,
                             stall_after_s=stall_after,
                             hosts=LOOPBACK_NAMES if host in LOOPBACK_HOSTS else (),
                             batching=batching, workers=workers, allocator=library)  # fmt: skip
    _serve_until_stopped(served, load, settings, listening, grace, access_log)


def _serve_until_stopped(
    served: type[ServedModel],
    load: Callable[[], ServedModel],
    settings: ServeSettings,
    listening: socket.socket,
    grace: float,
    access_log: bool = False,
) -> None:
    """uvicorn on ``listening`` until SIGTERM or Ctrl-C (then ``grace`` seconds to answer what it
    accepted); ``access_log``: a line for every request."""
    import uvicorn

    from attnkit.serve.app import make_app

    config = uvicorn.Config(None, timeout_graceful_shutdown=grace, log_level="info", access_log=access_log,
                            **http_stack(note))  # fmt: skip
    server = uvicorn.Server(config)
    config.app = make_app(served, load, settings, stopping=lambda: server.should_exit)
    # uvicorn stops gracefully on SIGTERM and SIGINT (Ctrl-C), then raises the signal again for the
    # handler it found: this one, which lets the command end with status 0 (a stop asked for is not a
    # failure), not the default, which would end the process by the signal (or KeyboardInterrupt)
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda number, frame: None)
    server.run(sockets=[listening])


def _allocator_library(allocator: str) -> str | None:
    """The library the worker processes preload for ``--allocator`` (cpu/allocator.py), said in one
    line; one line of error where the one asked for is not here."""
    from attnkit.cpu.allocator import AllocatorNotFoundError, choose

    try:
        library, line = choose(allocator)
    except AllocatorNotFoundError as error:
        raise AttnkitError(str(error)) from None
    note(line)
    return library


def http_stack(warn: Callable[[str], None]) -> dict[str, str]:
    """uvicorn's event loop and HTTP parser: uvloop and httptools, written in C, where they are installed
    (``attnkit[serve]`` installs them): at 32 clients they took a fifth less of the server's CPU per
    request than asyncio's loop and h11, and answered 10% more requests/s (docs/serving.md); else
    those, with one line saying so."""
    stack = {"loop": "uvloop", "http": "httptools"}
    missing = [name for name in stack.values() if importlib.util.find_spec(name) is None]
    if not missing:
        return stack
    warn(
        f"{' and '.join(missing)} not installed (pip install 'attnkit[serve]'): the server runs asyncio's "
        "event loop and h11's HTTP parser, which take about 1.3 times the CPU per request"
    )
    return {"loop": "asyncio", "http": "h11"}


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")  # --host values that only this machine reaches
# what a Host header may name on a server bound to one of them (a web page's DNS-rebinding attack
# names another: refused)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` for the server, or one line saying why it cannot be."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as error:
        raise AttnkitError(f"--host {host}: not an address to listen on ({error.strerror})") from None
    listening = socket.socket(family, kind, protocol)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind(address)
    except OSError as error:
        listening.close()
        raise AttnkitError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return listening
