"""Compiled steps built beside a running server (``decode.steps=auto``, the default): the server answers
at once with the model's own steps, and takes the compiled ones when they are built.

Building a translation model's compiled steps takes about 20 s a step (the first step and the beam's,
for a small model), once per model and settings on a machine: they are kept in a cache
(attnkit.cpu.compiled.cache), where a restarted server finds them at once. A server that waited for
them would not be ready for that long, so :class:`StepsBuilding` builds them in a process of its own
(on the model made again from this server's weights, as a worker process makes it), which no request
waits for. When the build ends, the running batches see the steps in the cache (they look every
second: decode/continuous.py) and the sources that join from then on take them; ``/health`` says
which steps serve, and the log says when they change, or why they could not be built.
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from attnkit.serve.worker_process import exit_described

LOG = logging.getLogger("uvicorn.error")


class StepsBuilding:
    """``build()`` run in a child process (see the module docstring); ``build`` is pickled to it.
    ``building`` says whether it still runs; the log hears when it ends, and how."""

    def __init__(self, build: Callable[[], Any]) -> None:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads forked
        self.connection, theirs = context.Pipe(duplex=False)
        self.process = context.Process(
            target=_child, args=(theirs, build), name="attnkit-compile", daemon=True
        )
        self.began = time.monotonic()
        self.process.start()
        theirs.close()
        self.failed: str | None = None  # why the build failed, once it has
        self.stopped = False  # the server ended it
        self.waiting = threading.Thread(target=self._wait, name="attnkit-compile-wait", daemon=True)
        self.waiting.start()
        LOG.info("decode.steps=auto: building the compiled decoding steps in the background (about 20 s "
                 "each, once); the model's own steps serve meanwhile")  # fmt: skip

    @property
    def building(self) -> bool:
        return self.waiting.is_alive()

    def _wait(self) -> None:
        """Wait for the child's word (or its end) and log it."""
        try:
            said = self.connection.recv()
        except (EOFError, OSError):
            self.process.join()
            said = f"the build process ended ({exit_described(self.process.exitcode)}) without a word"
        self.process.join()
        took = time.monotonic() - self.began
        if self.stopped:  # the server stops: nothing to say
            self.failed = said
        elif said is None:
            LOG.info("decode.steps=auto: the compiled decoding steps are built (%.0f s); the requests that "
                     "come from now on take them", took)  # fmt: skip
        else:
            self.failed = said
            LOG.warning("decode.steps=auto: the compiled decoding steps could not be built (%s); the "
                        "model's own steps serve", said)  # fmt: skip

    def stop(self) -> None:
        """End the build (the server stops): what it had written is a temporary file the cache's next
        build replaces."""
        self.stopped = True
        if self.process.is_alive():
            self.process.kill()
        # the waiting thread reaps the process: two threads joining one child race (the one that does not
        # reap it may return before its end is recorded, and the process then still looks alive)
        self.waiting.join(30)


def _child(connection: Any, build: Callable[[], Any]) -> None:
    """Build, then say None (built) or why not."""
    for number in (signal.SIGINT, signal.SIGTERM):  # the server ends its children itself
        signal.signal(number, signal.SIG_IGN)
    faulthandler.enable()  # a crash in the compiler writes its Python stack to the server's log
    try:
        build()
    except Exception as error:
        connection.send(f"{type(error).__name__}: {error}")
        return
    connection.send(None)
