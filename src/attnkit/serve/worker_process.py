"""A running batch in a process of its own (``attnkit serve --workers processes``, the default for
attnkit's engine on a CPU).

A worker thread of the continuous batcher (continuous.py) steps its running batch between two hops to
the event loop. PyTorch lets go of Python's lock inside each operation, but a decoding step is also
Python (the search's bookkeeping, the merges), and the server's own Python (HTTP, JSON, tokens)
shares that lock: on a small model at a high load, the steps and the server took turns on one lock
while a core stood idle. Here each worker's running batch lives in a child process with its own
interpreter (its model loaded there from the same checkpoint and settings): the worker thread sends
each iteration's newcomers and leavers down a pipe and waits, lock released, for the sources done.

:class:`WorkerProcess` has the running batch's interface (``iterate``, ``sources``, ``rows``), so the
batcher does not know the difference. The child steps on as many torch threads as the worker's
thread was given (the batcher shares the CPU out among its workers). Streaming prompts send their
pieces back with the step that made them, and the worker's thread hands them to the prompts' sinks.
A child that fails, or dies, makes the iteration fail (the batcher answers its requests with the
error and starts a new one); a child whose parent is gone sees its pipe close and exits.

Between two iterations the batcher's thread looks whether the event loop has news for the running batch
(a request waiting, a client gone); while it has none, the batch steps on. Here the child steps on by
itself (:meth:`WorkerProcess.steps_on`): it answers when a source is done, a streaming prompt has a
piece, the parent tells it there is news (:meth:`WorkerProcess.tell`, a flag in shared memory that the
event loop sets and the child reads between two steps), or the time it was given is up. One message a
step each way had the child wait for the parent's thread, which waits its turn on the server's
interpreter lock, at every step: on a Multi30k model, one client's sentences came 5-10% faster
from the engine alone without that wait, and the server's process spent a third less of a core at one
client (bench/engine_load.py, bench/serve_load.py).

A child that answers no step within ``deadline_s`` (stopped, deadlocked, swapping) is ended and the
iteration fails saying so, rather than its requests waiting for ever. The children ignore SIGINT and
SIGTERM: Ctrl-C in a terminal signals every process of the foreground group, and the server, which
finishes what runs before it exits, ends its children itself (or, if it is killed, they see their
pipes close).
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import signal
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from attnkit.cpu.allocator import preloaded

STARTED_WITHIN_S = 600.0  # how long a child may take to load its model before the worker gives up
# the longest a child steps on by itself before it answers (the batcher's stall clock and the deadline
# then see its steps move, however long a source runs)
STEP_ON_S = 1.0


@dataclass
class Remote:
    """A prompt as it goes to a child (a request's own ``Prompt`` holds what does not travel: a thread
    event, its client's sink): its text, its seed, whether it streams and, in the child, the sink that
    keeps its pieces."""

    text: str
    seed: int
    streamed: bool = False
    sink: Callable[[str], None] | None = None


class WorkerError(RuntimeError):
    """The child's iteration failed, or the child is gone: its running batch is lost."""


class WorkerNotStartedError(WorkerError):
    """The child could not load its model, or exited before it had."""


class WorkerGoneError(WorkerError):
    """The child is gone (killed, out of memory, ended for missing its deadline): it failed on nothing
    it was given, as far as anyone can tell."""


class WorkerProcess:
    """The running batch that ``build()`` makes, in a child process (see the module docstring).
    ``build`` is pickled to the child (a function of the module level, or a ``partial`` of one)."""

    def __init__(
        self,
        build: Callable[[], Any],
        name: str = "attnkit-worker",
        deadline_s: float = 300.0,
        preload: str | None = None,
    ) -> None:
        """``preload``: a memory allocator's library for the child to start with (cpu/allocator.py)."""
        self.deadline_s = deadline_s  # how long a step may take before the child is taken for hung
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads forked mid-step
        self.connection, theirs = context.Pipe()
        # 1 while the parent has news for the child (:meth:`tell`): a child stepping on answers
        self.news = context.RawValue("b", 0)
        self.process = context.Process(target=_child, args=(theirs, build, self.news), name=name, daemon=True)
        with preloaded(preload):
            self.process.start()
        theirs.close()
        self.ready = False
        self.sources = 0  # sources running (as the child said after the last iteration)
        self.rows = 0  # rows decoded at the next step
        self.sinks: dict[Hashable, Callable[[str], None]] = {}  # streaming inputs' sinks, by key

    def iterate(self, joining: list[tuple[Hashable, Any, Hashable]], leaving: set[Hashable]) -> list:
        """As the running batch's ``iterate``, in the child; on the calling thread's share of torch's
        threads. Streaming inputs' pieces go to their sinks before the call returns."""
        done, _, _ = self.steps_on(joining, leaving, lambda: 0.0)
        return done

    def steps_on(
        self,
        joining: list[tuple[Hashable, Any, Hashable]],
        leaving: set[Hashable],
        quiet_for: Callable[[], float],
    ) -> tuple[list, int, float]:
        """:meth:`iterate`, then more steps while no source is done, no streaming prompt has a piece,
        nobody :meth:`tell` s news, and the child has stepped for less than ``quiet_for()`` seconds (at
        most :data:`STEP_ON_S`; 0: one step). ``quiet_for`` is asked after the news flag is cleared, so
        that news coming while it answers still reach the child. Returns the sources done, the steps
        taken, and the seconds from the call to the end of the first step (the newcomers' first
        tokens)."""
        self.started()
        began = time.perf_counter()
        shipped = [(key, self._shipped(key, x), settings) for key, x, settings in joining]
        for key in leaving:
            self.sinks.pop(key, None)
        self.news.value = 0
        within = min(max(quiet_for(), 0.0), STEP_ON_S)
        before_send = time.perf_counter() - began  # (+ the child's time to its first step's end)
        self._send(("iterate", shipped, set(leaving), torch.get_num_threads(), within))
        done, pieces, self.sources, self.rows, steps, first_s = self._receive()
        for key, piece in pieces:
            sink = self.sinks.get(key)
            if sink is not None:
                sink(piece)
        for key, _ in done:
            self.sinks.pop(key, None)
        return done, steps, before_send + first_s

    def tell(self) -> None:
        """The parent has news for the child (a request waiting, a client gone): one stepping on
        answers after its current step. Safe from any thread."""
        self.news.value = 1

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def end(self) -> None:
        """Kill the child at once (its running batch is dropped): a thread waiting on its step is
        answered, the pipe closing, with :class:`WorkerGoneError`. Safe from any thread."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()

    def close(self) -> None:
        """Stop the child (its running batch is dropped); no thread may be waiting on it."""
        self.connection.close()  # the child sees the pipe close and exits
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.end()

    def _shipped(self, key: Hashable, x: Any) -> Any:
        """A prompt as a :class:`Remote` (its sink kept here, by key); a text as it is."""
        if not hasattr(x, "seed"):
            return x
        if x.sink is not None:
            self.sinks[key] = x.sink
        return Remote(x.text, x.seed, streamed=x.sink is not None)

    def started(self) -> None:
        """Wait until the child has loaded its model (blocks; at once after the first time)."""
        if self.ready:
            return
        began = time.monotonic()
        while not self.connection.poll(1.0):
            if not self.process.is_alive():
                raise WorkerNotStartedError(
                    f"the worker process ended ({exit_described(self.process.exitcode)}) as it started"
                )
            if time.monotonic() - began > STARTED_WITHIN_S:
                raise WorkerNotStartedError(f"the worker process did not start in {STARTED_WITHIN_S:g} s")
        try:
            self._receive()
        except WorkerError as error:
            raise WorkerNotStartedError(str(error)) from None
        self.ready = True

    def _send(self, message: tuple) -> None:
        try:
            self.connection.send(message)
        except (OSError, ValueError) as error:
            raise WorkerGoneError(f"the worker process is gone ({self._exit()}): {error}") from None

    def _receive(self) -> Any:
        """The child's answer to the last message, within the deadline (else the child is ended)."""
        try:
            if not self.connection.poll(self.deadline_s):
                self.end()
                said = f"the worker process answered no step within {self.deadline_s:g} s and was ended"
                raise WorkerGoneError(f"{said} (it was stopped, deadlocked or swapping)")
            kind, payload = self.connection.recv()
        except (EOFError, OSError) as error:
            gone = f"the worker process is gone ({self._exit()}): {str(error) or 'its pipe closed'}"
            raise WorkerGoneError(gone) from None
        if kind == "failed":
            raise WorkerError(payload)
        return payload

    def _exit(self) -> str:
        self.process.join(timeout=1)
        return exit_described(self.process.exitcode)


def exit_described(code: int | None) -> str:
    """How a child process ended, for an error: its exit code, or the signal that ended it (a negative
    code: ``-11`` is SIGSEGV, a crash in native code, whose Python stack the child wrote to the server's
    standard error)."""
    if code is None:
        return "still running"
    if code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    crashed = " (a crash; its stack is in the server's log)" if -code in _CRASHES else ""
    return f"ended by {name}{crashed}"


# the signals of a crash in native code, for which faulthandler writes the Python stack
_CRASHES = {signal.SIGSEGV, signal.SIGFPE, signal.SIGABRT, signal.SIGBUS, signal.SIGILL}


def _child(connection: Any, build: Callable[[], Any], news: Any) -> None:
    """The child's loop: build the running batch, then iterate it as the parent asks (stepping on while
    nothing is done, ``news.value`` is 0 and its time lasts: :meth:`WorkerProcess.steps_on`) until the
    pipe closes. A failed iteration is reported and ends the child (its batch is in no known state)."""
    for number in (signal.SIGINT, signal.SIGTERM):  # the server ends its children (module docstring)
        signal.signal(number, signal.SIG_IGN)
    faulthandler.enable()  # a crash in native code writes each thread's Python stack to standard error
    try:
        batch = build()
    except Exception as error:
        said = f"the worker process could not load the model: {type(error).__name__}: {error}"
        connection.send(("failed", said))
        return
    connection.send(("started", None))
    threads = torch.get_num_threads()
    # what the streaming prompts' sinks heard during an iteration: one list for the child's life (a
    # prompt's sink, set as it joins, keeps adding to it at every later step), emptied as it is sent
    pieces: list[tuple[Hashable, str]] = []
    while True:
        try:
            _, joining, leaving, wanted, within = connection.recv()
        except (EOFError, OSError):  # the parent has gone, or closed us
            return
        began = time.monotonic()
        try:
            if wanted != threads:
                torch.set_num_threads(wanted)
                threads = wanted
            for key, x, _ in joining:
                if isinstance(x, Remote) and x.streamed:
                    x.sink = partial(_keep, pieces, key)
            done, steps = batch.iterate(joining, leaving), 1
            first_s = time.monotonic() - began
            while not done and batch.sources and not pieces and not news.value:
                if time.monotonic() - began >= within:
                    break
                done, steps = batch.iterate([], set()), steps + 1
        except Exception as error:
            connection.send(("failed", f"{type(error).__name__}: {error}"))
            return
        connection.send(("done", (done, pieces, batch.sources, batch.rows, steps, first_s)))
        pieces.clear()


def _keep(pieces: list[tuple[Hashable, str]], key: Hashable, piece: str) -> None:
    pieces.append((key, piece))
