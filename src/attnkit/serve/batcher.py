"""Dynamic batching: concurrent requests grouped into batches, run one batch at a time by one thread.

A model searches a batch of sentences in little more time than one, so a server that runs each request
alone wastes the machine as soon as two clients wait. The batcher queues every request's inputs; its
loop takes the oldest, then keeps adding the next ones for up to ``max_wait_ms`` or until the batch
holds ``max_batch_tokens`` source tokens, and runs the batch in its model thread (one at a time: a
model is not run by two threads at once, and the event loop stays free to accept requests meanwhile).
Requests with other decoding settings (a beam of 1 and one of 5) do not share a search: each batch is
split into groups of equal settings, run one after another.

A request whose inputs make the batch fail (the model raises) fails alone: the batch is run again
request by request, and the others are answered. A full queue refuses new requests (the server answers
503 with Retry-After) rather than letting latency grow without bound; a request whose client has gone
(its future cancelled) is dropped before its batch runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
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
    future: asyncio.Future = field(repr=False)
    queued: float = field(default_factory=time.perf_counter)


class Batcher:
    """Runs ``run(inputs, settings) -> outputs`` (blocking, in one thread) on batches of requests.

    ``observe(batch_requests, batch_inputs, seconds)`` hears of every batch run (for metrics)."""

    def __init__(
        self,
        run: Callable[[list[Any], Hashable], list[Any]],
        *,
        max_batch_tokens: int,
        max_wait_ms: float,
        max_queue: int,
        observe: Callable[[int, int, float], None] = lambda requests, inputs, seconds: None,
    ) -> None:
        self.run, self.observe = run, observe
        self.max_batch_tokens, self.max_wait, self.max_queue = max_batch_tokens, max_wait_ms / 1000, max_queue
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnkit-model")
        self.loop_task: asyncio.Task | None = None

    def start(self) -> None:
        self.loop_task = asyncio.get_running_loop().create_task(self._serve())

    async def stop(self) -> None:
        """Stop the loop and the model thread, once the batch running (if any) ends. The server stops
        the batcher only after its requests are answered or, past the grace period, cut off: the
        requests still queued then have no client, and are dropped."""
        if self.loop_task is not None:
            self.loop_task.cancel()
        while not self.queue.empty():
            self.queue.get_nowait().future.cancel()
        await asyncio.get_running_loop().run_in_executor(None, self.model_thread.shutdown)

    def waiting(self) -> int:
        """Requests queued and not yet in a batch."""
        return self.queue.qsize()

    async def submit(self, inputs: list[Any], settings: Hashable, tokens: int) -> list[Any]:
        """The outputs of ``inputs`` once their batch has run; :class:`QueueFullError` at once if the queue
        is full. Cancelling the caller (a client gone) drops the request if its batch has not begun."""
        if self.queue.qsize() >= self.max_queue:
            raise QueueFullError(f"{self.max_queue} requests are already waiting")
        job = Job(inputs, settings, tokens, asyncio.get_running_loop().create_future())
        self.queue.put_nowait(job)
        return await job.future

    async def _serve(self) -> None:
        while True:
            batch = await self._collect()
            groups: dict[Hashable, list[Job]] = {}
            for job in batch:
                if not job.future.cancelled():
                    groups.setdefault(job.settings, []).append(job)
            for settings, jobs in groups.items():
                await self._run_group(settings, jobs)

    async def _collect(self) -> list[Job]:
        """The oldest request and those that follow within the wait, up to the token budget."""
        first = await self.queue.get()
        batch, tokens = [first], first.tokens
        deadline = time.perf_counter() + self.max_wait
        while tokens < self.max_batch_tokens:
            try:
                job = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), left)
                except asyncio.TimeoutError:
                    break
            if tokens + job.tokens > self.max_batch_tokens:
                self._put_back(job)
                break
            batch.append(job)
            tokens += job.tokens
        return batch

    def _put_back(self, job: Job) -> None:
        """A request that does not fit this batch goes first into the next."""
        rest = [job]
        while not self.queue.empty():
            rest.append(self.queue.get_nowait())
        for waiting in rest:
            self.queue.put_nowait(waiting)

    async def _run_group(self, settings: Hashable, jobs: list[Job]) -> None:
        inputs = [x for job in jobs for x in job.inputs]
        loop, began = asyncio.get_running_loop(), time.perf_counter()
        try:
            outputs = await loop.run_in_executor(self.model_thread, self.run, inputs, settings)
        except Exception as error:
            if len(jobs) == 1:
                _settle(jobs[0], error=error)
            else:  # find the request that fails: each alone
                for job in jobs:
                    await self._run_group(settings, [job])
            return
        self.observe(len(jobs), len(inputs), time.perf_counter() - began)
        start = 0
        for job in jobs:
            _settle(job, result=outputs[start : start + len(job.inputs)])
            start += len(job.inputs)


def _settle(job: Job, result: Any = None, error: BaseException | None = None) -> None:
    """Answer a job's waiting request, unless its client has gone."""
    if job.future.done():
        return
    if error is not None:
        job.future.set_exception(error)
    else:
        job.future.set_result(result)
