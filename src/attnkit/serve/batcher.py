"""Dynamic batching: concurrent requests grouped into batches, run by the model's workers.

A model searches a batch of sentences in little more time than one, so a server that runs each request
alone wastes the machine as soon as two clients wait. The batcher queues every request's inputs; once a
worker is free, it takes the oldest request, then keeps adding the next ones for up to ``max_wait_ms``
or until the batch holds ``max_batch_tokens`` source tokens, and runs the batch on that worker (a thread
of its own; the event loop stays free to accept requests meanwhile). While every worker is busy,
requests wait in the queue, and the next batch takes them at once. Requests with other decoding
settings (a beam of 1 and one of 5) do not share a search: each batch is split into groups of equal
settings, run one after another.

``workers`` batches run at a time (``decode.streams``, as the command line's translations run side by
side, decode/streams.py): a request that arrives while a batch runs can start on another worker instead of
waiting for it. Before each batch, ``prepare(running)`` tells its worker how many batches run now, this
one included, so that a batch alone takes every thread of the CPU and batches side by side share
them. Work that must not overlap a batch (the attention explorer hooks the model) is queued as a request
of its own (:meth:`alone`): it waits its turn like any request, counts towards ``max_queue``, and runs
once every worker is free. Only the batcher's loop takes workers, so two such requests cannot each hold
some workers while waiting for the others (a deadlock that froze every later request).

A request whose inputs make the batch fail (the model raises) fails alone: the batch is run again
request by request, and the others are answered. A full queue refuses new requests (the server answers
503 with Retry-After) rather than letting latency grow without bound; a request whose client has gone
(its future cancelled) is dropped before its batch runs, and ``abandon(inputs)`` tells the model of one
whose batch already runs (a generator then stops extending its prompts). :meth:`stalled_for` says how
long requests have waited or run without any batch starting or ending, for ``/health``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from typing import Any

from attnkit.serve.batching import Batching, Budget, Job, settle, settle_with


class Batcher(Batching):
    """Runs ``run(inputs, settings) -> outputs`` (blocking) on batches of requests, ``workers`` at a time,
    each on a worker thread that ``prepare(running)`` readies first (see the module docstring).

    ``observe(batch_requests, batch_inputs, seconds)`` hears of every batch run (for metrics);
    ``abandon(inputs)`` of the inputs of a request whose client has gone while its batch runs."""

    def __init__(
        self,
        run: Callable[[list[Any], Hashable], list[Any]],
        *,
        max_batch_tokens: int,
        max_wait_ms: float,
        max_queue: int,
        max_batch_positions: int | None = None,
        workers: int = 1,
        prepare: Callable[[int], None] = lambda running: None,
        observe: Callable[[int, int, float], None] = lambda requests, inputs, seconds: None,
        abandon: Callable[[list[Any]], None] = lambda inputs: None,
    ) -> None:
        super().__init__(max_queue, workers, prepare)
        self.run, self.observe, self.abandon = run, observe, abandon
        self.max_wait = max_wait_ms / 1000
        self.budget = Budget(max_batch_tokens, max_batch_positions)
        self.taken: list[Job] = []  # the next batch's requests, out of the queue while a worker is awaited
        # a batch goes to the idle worker that comes first, so that at a low load the same thread runs
        # batch after batch (a thread's CPU threads stay warm; another's would idle)
        self.idle = list(range(workers))
        # a permit per idle worker (made in the loop); only _serve acquires them
        self.free: asyncio.Semaphore | None = None
        self.loop_task: asyncio.Task | None = None
        self.running: set[asyncio.Task] = set()

    def start(self) -> None:
        super().start()
        self.free = asyncio.Semaphore(self.workers)
        self.loop_task = asyncio.get_running_loop().create_task(self._serve())

    async def stop(self) -> None:
        """Stop the loop and the workers, once the batches running (if any) end. The server stops the
        batcher only after its requests are answered or, past the grace period, cut off: the requests
        still queued then have no client, and are dropped."""
        if self.loop_task is not None:
            self.loop_task.cancel()
        for job in self.taken:
            job.future.cancel()
        self._drop_queue()
        if self.running:
            await asyncio.wait(self.running)
        await self._join_threads()

    def waiting(self) -> int:
        """Requests not yet in a running batch: queued, or taken for the next batch while it awaits a
        worker."""
        return len(self.queue) + len(self.taken)

    def stalled_for(self) -> float:
        """Seconds that requests have waited or run without any batch starting or ending (0 while
        nothing waits or runs): a server that has stopped making progress, for ``/health``."""
        if not self.waiting() and not self.running:
            return 0.0
        return time.monotonic() - self.progressed

    def _busy(self) -> bool:
        return bool(self.running)

    def _queueing(self, job: Job) -> None:
        if job.work is None:  # a client gone while its batch runs: the model hears of it
            job.future.add_done_callback(lambda future: future.cancelled() and self.abandon(job.inputs))

    async def _serve(self) -> None:
        assert self.free is not None
        while True:
            while not self.queue:
                await self._arrival()
            self.taken = [self.queue.pop(0)]
            if self.taken[0].work is not None:
                await self._run_alone(self.taken[0])
                continue
            # a worker free, its batch is collected: the requests that came while all were busy go
            # into it at once (and no worker is held while no request waits)
            await self.free.acquire()
            try:
                await self._collect(self.taken)
            except BaseException:
                self.free.release()
                raise
            batch, self.taken = self.taken, []
            self.progressed = time.monotonic()
            worker = self.idle.pop(0)
            running = self.workers - len(self.idle)  # batches running now, this one included
            task = asyncio.get_running_loop().create_task(self._run_batch(batch, worker, running))
            self.running.add(task)
            task.add_done_callback(self.running.discard)

    async def _run_batch(self, batch: list[Job], worker: int, running: int) -> None:
        """One batch on the worker taken for it, each group of equal settings in turn."""
        assert self.free is not None
        try:
            groups: dict[Hashable, list[Job]] = {}
            for job in batch:
                if not job.future.cancelled():
                    groups.setdefault(job.settings, []).append(job)
            for settings, jobs in groups.items():
                await self._run_group(settings, jobs, worker, running)
        finally:
            self.idle = sorted([*self.idle, worker])
            self.progressed = time.monotonic()
            self.free.release()

    async def _run_alone(self, job: Job) -> None:
        """A job of :meth:`alone`: every worker's permit taken (the loop alone takes them, so this cannot
        deadlock), its work on the first worker's thread, then the permits given back."""
        assert self.free is not None and job.work is not None
        held = 0
        try:
            while held < self.workers:
                await self.free.acquire()
                held += 1
            self.taken = []
            if job.future.cancelled():
                return
            self.progressed = time.monotonic()
            await settle_with(job, self.threads[0], self._alone, job.work, job.inputs)
        finally:
            self.taken = []
            self.progressed = time.monotonic()
            for _ in range(held):
                self.free.release()

    async def _collect(self, batch: list[Job]) -> None:
        """Add to ``batch`` (the oldest request) those that follow within the wait, within the budget; a
        request that does not fit stays first in the queue, for the next batch."""
        deadline = time.perf_counter() + self.max_wait
        while not self.budget.full(batch):
            if not self.queue:
                left = deadline - time.perf_counter()
                if left <= 0 or not await self._arrival(left):
                    break
                continue
            if self.queue[0].work is not None or not self.budget.fits(batch, self.queue[0]):
                break
            batch.append(self.queue.pop(0))

    def _on_worker(self, inputs: list[Any], settings: Hashable, running: int) -> list[Any]:
        self.prepare(running)
        return self.run(inputs, settings)

    async def _run_group(self, settings: Hashable, jobs: list[Job], worker: int, running: int) -> None:
        inputs = [x for job in jobs for x in job.inputs]
        loop, began = asyncio.get_running_loop(), time.perf_counter()
        try:
            outputs = await loop.run_in_executor(
                self.threads[worker], self._on_worker, inputs, settings, running
            )
        except Exception as error:
            if len(jobs) == 1:
                settle(jobs[0], error=error)
            else:  # find the request that fails: each alone
                for job in jobs:
                    await self._run_group(settings, [job], worker, running)
            return
        self.observe(len(jobs), len(inputs), time.perf_counter() - began)
        start = 0
        for job in jobs:
            settle(job, result=outputs[start : start + len(job.inputs)])
            start += len(job.inputs)
