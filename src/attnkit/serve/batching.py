"""What the server's two batchers share: :class:`Batching`, the interface the server holds either by.

``Batcher`` (batcher.py) runs batches of requests to their end; ``ContinuousBatcher`` (continuous.py)
keeps running batches that requests join and leave at any step. Both queue each request as a
:class:`Job`, oldest first, bounded by ``max_queue`` (a full queue refuses at once: the server answers
503 rather than letting latency grow without bound); both run the model on a thread per worker, each
readied by ``prepare(running)`` for its share of the CPU; both run work that must not overlap the
model's (the attention explorer hooks it) alone, as a request of its own queued behind those waiting;
and both keep the clock ``/health`` reads: when a request last came to an idle server or work last
moved.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


class QueueFullError(Exception):
    """The batcher already holds ``max_queue`` requests."""


@dataclass
class Job:
    """One request's inputs, waiting for their outputs (one per input, in order)."""

    inputs: list[Any]
    settings: Hashable  # requests share a search only with equal settings
    tokens: int  # what the request adds to a batch's token budget
    positions: int  # the token positions its rows hold at most (serve/state.py: check_positions)
    future: asyncio.Future = field(repr=False)
    queued: float = field(default_factory=time.perf_counter)
    work: Callable[..., Any] | None = None  # work(*inputs) alone, with no batch beside it (see alone())


class Batching:
    """A queue of :class:`Job` s, oldest first, served by ``workers`` threads (see the module docstring).
    The batchers say how they serve it: :meth:`start` (on the event loop), :meth:`stop`,
    :meth:`stalled_for` and :meth:`_busy`."""

    def __init__(self, max_queue: int, workers: int, prepare: Callable[[int], None]) -> None:
        self.max_queue, self.workers, self.prepare = max_queue, workers, prepare
        self.queue: list[Job] = []  # oldest first
        # set when a job is queued (an Event binds to the event loop that first waits on it, since 3.10)
        self.arrived = asyncio.Event()
        self.threads = [
            ThreadPoolExecutor(1, thread_name_prefix=f"attnkit-model-{i}") for i in range(workers)
        ]
        self.progressed = time.monotonic()  # when work last moved, or a request came to an idle server
        self.broken: str | None = None  # why the workers cannot run (/health: failed), if they cannot

    def started(self) -> None:
        """Wait until the workers can run (threads: at once; running batches in processes: once loaded)."""

    def start(self) -> None:
        """Start serving the queue (on the event loop)."""

    async def stop(self) -> None:
        raise NotImplementedError

    def waiting(self) -> int:
        """Requests not yet running."""
        return len(self.queue)

    def stalled_for(self) -> float:
        """Seconds that requests have waited or run without progress (0 when idle), for ``/health``."""
        raise NotImplementedError

    async def submit(
        self, inputs: list[Any], settings: Hashable, tokens: int, positions: int = 0
    ) -> list[Any]:
        """The outputs of ``inputs`` (one each) once they are done; :class:`QueueFullError` at once if
        the queue is full. Cancelling the caller (a client gone) drops the request."""
        return await self._queued(Job(inputs, settings, tokens, positions, self._future()))

    async def alone(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` on a worker's thread while the model runs nothing else: queued behind the
        requests already waiting (so :class:`QueueFullError` when the queue is full)."""
        return await self._queued(Job(list(args), None, 0, 0, self._future(), work=work))

    def _busy(self) -> bool:
        """Whether the workers run anything now."""
        raise NotImplementedError

    def _queueing(self, job: Job) -> None:
        """What a batcher does as ``job`` is queued (nothing, unless it says)."""

    async def _queued(self, job: Job) -> Any:
        if self.waiting() >= self.max_queue:
            raise QueueFullError(f"{self.max_queue} requests are already waiting")
        if not self.queue and not self._busy():
            self.progressed = time.monotonic()  # an idle server starts its clock with this request
        self._queueing(job)
        self.queue.append(job)
        self.arrived.set()
        return await job.future

    async def _arrival(self, timeout: float | None = None) -> bool:
        """Wait until a job is queued (True), or ``timeout`` seconds pass (False)."""
        self.arrived.clear()
        try:
            await asyncio.wait_for(self.arrived.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def _drop_queue(self) -> None:
        """Cancel every request still waiting (the server stops: they have no client any more)."""
        for job in self.queue:
            job.future.cancel()
        self.queue = []

    async def _join_threads(self) -> None:
        for thread in self.threads:
            await asyncio.get_running_loop().run_in_executor(None, thread.shutdown)

    def _alone(self, work: Callable[..., Any], args: list[Any]) -> Any:
        """Work alone, on a worker's thread readied to take every CPU thread."""
        self.prepare(1)
        return work(*args)

    @staticmethod
    def _future() -> asyncio.Future:
        return asyncio.get_running_loop().create_future()


@dataclass(frozen=True)
class Budget:
    """What a batch may hold: ``tokens`` of input, and ``positions`` token positions in its rows (None:
    no bound but the tokens)."""

    tokens: int
    positions: int | None = None

    def fits(self, jobs: Iterable[Job], job: Job) -> bool:
        """Whether ``job`` fits beside ``jobs``."""
        jobs = list(jobs)
        if sum(j.tokens for j in jobs) + job.tokens > self.tokens:
            return False
        return self.positions is None or sum(j.positions for j in jobs) + job.positions <= self.positions

    def full(self, jobs: Iterable[Job]) -> bool:
        """Whether ``jobs`` already take the whole budget."""
        jobs = list(jobs)
        held = sum(j.positions for j in jobs)
        return sum(j.tokens for j in jobs) >= self.tokens or (
            self.positions is not None and held >= self.positions
        )


async def settle_with(job: Job, thread: ThreadPoolExecutor, call: Callable[..., Any], *args: Any) -> None:
    """Answer ``job`` with what ``call(*args)`` gives (or raises) on ``thread``."""
    try:
        result = await asyncio.get_running_loop().run_in_executor(thread, call, *args)
    except Exception as error:
        settle(job, error=error)
    else:
        settle(job, result=result)


def settle(job: Job, result: Any = None, error: BaseException | None = None) -> None:
    """Answer a job's waiting request, unless its client has gone."""
    if job.future.done():
        return
    if error is not None:
        job.future.set_exception(error)
    else:
        job.future.set_result(result)
