"""Continuous batching: requests join a running batch at its next step and leave it as soon as they are
done (``attnkit serve --batching continuous``; translation and summarisation on attnkit's engine).

The batcher of batcher.py runs a batch to its end: a request that comes meanwhile waits for the
batch's longest sentence. Here each worker keeps one running batch (a :class:`RunningBatch` such as
``attnkit.decode.continuous.RunningTranslations``) and loops: it admits waiting requests, oldest
first, while its batch holds fewer than ``max_batch_tokens`` source tokens and ``max_batch_positions``
token positions in its rows (each row its source and the longest output it may write, so that beams
and long outputs count as the memory and steps they take); a request that does not fit waits at the
front, and nothing overtakes it, so a long request is never starved; while its batch is busy,
newcomers wait a little for company (HOLD_FROM, below); on its thread, it runs the newcomers' first
step and one step of every running sentence, and goes on stepping while no sentence is done and
nothing new has come (each hop back to the event loop costs time; a running batch in a process of its
own steps on there, told of what comes meanwhile: worker_process.py); it answers the requests whose
sentences are all done. A request whose client has gone leaves the batch at the next step. While
nothing runs or waits, the workers sleep.

It shares the batcher's queue, threads and interface (batching.py), so the server's state takes
either. Work that must not overlap a step (the attention explorer hooks the model) pauses every
worker between two iterations, runs, and lets them go on.
An iteration that fails answers every request of its worker's batch with the error (a new running
batch takes its place): unlike a batch, a running batch cannot be rerun request by request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from attnkit.serve.batching import Batching, Budget, Job, settle, settle_with
from attnkit.serve.worker_process import WorkerNotStartedError

LOG = logging.getLogger("uvicorn.error")

# Newcomers' first step (their encoder and the start token) reads every weight of the model, about what
# a step of the whole running batch costs, so newcomers that join one at a time pay it each. While a
# running batch holds at least HOLD_FROM sources, newcomers wait for company: until HOLD_GROUP of them
# wait, or the oldest has waited HOLD_S (a step or two). On 2 cores, beam 5, 8 to 32 sources a worker,
# that gave 5-11% more sentences/s and a lower median latency (the wait is less than the time saved).
HOLD_FROM, HOLD_GROUP, HOLD_S = 4, 4, 0.03


class RunningBatch(Protocol):
    """A running batch: ``iterate(joining, leaving)`` admits ``joining`` (``(key, input, settings)``),
    drops the sources ``leaving``, steps every source and returns ``(key, output)`` of those done."""

    sources: int  # sources running
    rows: int  # rows decoded at the next step

    def iterate(self, joining: list[tuple[Hashable, Any, Hashable]], leaving: set[Hashable]) -> list: ...


@dataclass
class Flight:
    """A request in a worker's running batch: its outputs as they come."""

    job: Job
    outputs: list[Any]
    left: int  # inputs not yet done
    joined: float = field(default_factory=time.perf_counter)


class ContinuousBatcher(Batching):
    """Runs requests through ``workers`` running batches, each made by ``running_batch()`` and stepped on its
    own thread (see the module docstring). ``prepare(running)`` readies a worker's thread (its share
    of the CPU); ``observe(rows, sources, first_tokens, seconds, steps)`` hears of every hop to a
    worker's thread: the rows and sources running after it, the times to first token of the requests
    that joined (from their arrival to the end of their first step), its time and its steps (for
    metrics)."""

    def __init__(
        self,
        running_batch: Callable[[], RunningBatch],
        *,
        max_batch_tokens: int,
        max_queue: int,
        max_batch_positions: int | None = None,
        workers: int = 1,
        prepare: Callable[[int], None] = lambda running: None,
        observe: Callable[[int, int, list[float], float, int], None] = lambda *heard: None,
    ) -> None:
        super().__init__(max_queue, workers, prepare)
        self.new_running_batch, self.observe = running_batch, observe
        self.budget = Budget(max_batch_tokens, max_batch_positions)  # what each running batch may hold
        self.running = [running_batch() for _ in range(workers)]  # each worker's
        self.flights: list[dict[int, Flight]] = [{} for _ in range(workers)]  # each worker's requests
        self.ids = itertools.count()
        self.loops: list[asyncio.Task] = []
        self.pause: asyncio.Future | None = None  # while set, workers wait for it between iterations
        self.iterating = 0  # workers in an iteration now
        self.prepared = [0] * workers  # the running workers each worker's thread was last readied for
        self.stepped = [self.progressed] * workers  # when each worker's running batch last moved

    def started(self) -> None:
        """Wait until every running batch can step (one in a process of its own has loaded its model); blocks,
        so off the event loop. Raises where one could not start, and then lets every one go: the
        others, loaded or still loading, would otherwise sit idle in their processes until exit."""
        try:
            for batch in self.running:
                getattr(batch, "started", lambda: None)()
        except Exception:
            for batch in self.running:
                _close(batch)
            raise

    def start(self) -> None:
        super().start()
        loop = asyncio.get_running_loop()
        self.loops = [loop.create_task(self._work(worker)) for worker in range(self.workers)]

    async def stop(self) -> None:
        """Stop the workers and drop what waits (as Batcher.stop): the running batches in processes of
        their own are ended first, so that a worker's thread waiting on a step that never comes (a hung
        worker process) is answered, and then the threads are joined."""
        for task in self.loops:
            task.cancel()
        for task in self.loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._drop_queue()
        for flights in self.flights:
            for flight in flights.values():
                flight.job.future.cancel()
        for batch in self.running:
            getattr(batch, "end", lambda: None)()
        await self._join_threads()
        for batch in self.running:
            _close(batch)

    def running_rows(self) -> int:
        """Rows the running batches decode at their next steps."""
        return sum(batch.rows for batch in self.running)

    def stalled_for(self) -> float:
        """The longest that a worker's running batch has held requests without its iteration ending, or
        that requests have waited with no worker moving (0 when idle): one hung worker process shows here
        while the others go on."""
        now = time.monotonic()
        stalls = [now - self.stepped[worker] for worker in range(self.workers) if self.flights[worker]]
        if self.queue:
            stalls.append(now - self.progressed)
        return max(stalls, default=0.0)

    def _busy(self) -> bool:
        return any(self.flights)

    async def _work(self, worker: int) -> None:
        """One worker's loop: admit, iterate, answer; sleep while there is nothing to do."""
        flights = self.flights[worker]
        while True:
            if self.pause is not None:
                await self.pause
                continue
            if self.queue and self.queue[0].work is not None:
                await self._run_alone(self.queue[0])
                continue
            joining = self._admit(worker)
            if not joining and not flights:
                await self._arrival()
                continue
            gone = [job_id for job_id, flight in flights.items() if flight.job.future.done()]
            leaving = {(job_id, i) for job_id in gone for i in range(len(flights.pop(job_id).outputs))}
            inputs = [((job_id, i), x, flights[job_id].job.settings)
                      for job_id in joining for i, x in enumerate(flights[job_id].job.inputs)]  # fmt: skip
            if len(flights) == len(joining):  # nothing ran before: its clock starts now
                self.stepped[worker] = time.monotonic()
            began = time.perf_counter()
            try:
                done = await self._iteration(worker, inputs, leaving, idle=len(flights) == len(joining))
            except Exception as error:
                LOG.exception("a running batch failed; its requests are answered with the error")
                for flight in flights.values():
                    settle(flight.job, error=error)
                flights.clear()
                await self._replace(worker)
                continue
            done, steps, first_token = done
            first_tokens = [first_token - flights[job_id].job.queued for job_id in joining]
            sources = sum(batch.sources for batch in self.running)
            self.observe(self.running_rows(), sources, first_tokens, time.perf_counter() - began, steps)
            for (job_id, i), output in done:
                flight = flights.get(job_id)
                if flight is None:
                    continue
                flight.outputs[i] = output
                flight.left -= 1
                if flight.left == 0:
                    settle(flight.job, result=flight.outputs)
                    del flights[job_id]

    async def _iteration(self, worker: int, inputs: list, leaving: set, idle: bool) -> tuple:
        """One hop to the worker's thread (:meth:`_iterate`). A running batch whose process has gone while
        it held nothing (a worker process killed while idle) lost nothing: a new one takes the newcomers. One
        that cannot start makes the batcher broken (``/health`` says so) until an iteration
        succeeds."""
        if idle and not getattr(self.running[worker], "alive", True):
            LOG.warning("a worker process had gone while it held nothing; a new one takes its requests")
            await self._replace(worker)
            leaving = set()  # (the new running batch holds none of them)
        self.iterating += 1
        try:
            done = await asyncio.get_running_loop().run_in_executor(
                self.threads[worker], self._iterate, worker, inputs, leaving
            )
        except WorkerNotStartedError as error:
            self.broken = str(error)
            raise
        finally:
            self.iterating -= 1
            self.progressed = self.stepped[worker] = time.monotonic()
        self.broken = None
        return done

    async def _replace(self, worker: int) -> None:
        """A new running batch for ``worker`` in place of its failed one, the old one let go and the new
        one made on the worker's thread (a worker process pickles the model's weights for its child: not
        on the event loop)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.threads[worker], _close, self.running[worker])
        self.running[worker] = await loop.run_in_executor(self.threads[worker], self.new_running_batch)

    def _load(self, worker: int) -> int:
        """Source tokens in a worker's running batch."""
        return sum(flight.job.tokens for flight in self.flights[worker].values())

    def _admit(self, worker: int) -> list[int]:
        """Waiting requests, oldest first, that fit the worker's budget (the first always fits an empty
        batch; one that does not fit stops the admission), while no other worker holds fewer tokens
        (the load is spread), and no idle worker comes before it: they join its running batch. None
        while they wait for company (:meth:`_held`)."""
        flights, tokens = self.flights[worker], self._load(worker)
        if not flights and not all(self.flights[:worker]):
            return []  # an idle worker before this one takes them: at a low load the same thread
            # runs step after step (the CPU threads of another, left idle, would spin meanwhile)
        if flights and self._held(worker):
            return []
        others = [self._load(other) for other in range(self.workers) if other != worker]
        joining = []
        while self.queue and self.queue[0].work is None:
            job = self.queue[0]
            if job.future.done():  # its client went while it waited
                self.queue.pop(0)
                continue
            held = [flight.job for flight in flights.values()]
            if flights and (not self.budget.fits(held, job) or any(o < tokens for o in others)):
                break
            self.queue.pop(0)
            job_id = next(self.ids)
            flights[job_id] = Flight(job, [None] * len(job.inputs), len(job.inputs))
            tokens += job.tokens
            joining.append(job_id)
        return joining

    def _iterate(self, worker: int, joining: list, leaving: set) -> list:
        # the CPU's threads shared among the workers with requests (one alone takes them all); set
        # only when that changes (setting them costs more than a small step)
        running = max(1, sum(1 for flights in self.flights if flights))
        if self.prepared[worker] != running:
            self.prepare(running)
            self.prepared[worker] = running
        batch = self.running[worker]
        steps_on = getattr(batch, "steps_on", None)
        if steps_on is not None:  # a running batch in a process of its own steps on there (worker_process.py)
            began = time.perf_counter()
            done, steps, first_s = steps_on(joining, leaving, lambda: self._quiet_for(worker))
            return done, steps, began + first_s
        done, steps = batch.iterate(joining, leaving), 1
        first_token = time.perf_counter()  # the newcomers' first tokens are out
        # on, a step at a time, while nothing is done and nothing new has come: one hop to the event
        # loop and back costs more than the time a step's outputs would wait
        while not done and batch.sources and not self._news(worker):
            # (for /health: steps go on, however long the hop)
            self.progressed = self.stepped[worker] = time.monotonic()
            done, steps = batch.iterate([], set()), steps + 1
        return done, steps, first_token

    def _quiet_for(self, worker: int) -> float:
        """How long a worker's running batch may step on without hearing from the event loop: not at
        all with news now (:meth:`_news`); else until the newcomers held for company stop waiting, or
        for as long as nothing comes (news coming meanwhile are told: :meth:`_tell`)."""
        if self._news(worker):
            return 0.0
        first = next(iter(self.queue), None)
        if first is not None and first.work is None:  # held (:meth:`_held`): until its wait ends
            return first.queued + HOLD_S - time.perf_counter()
        return float("inf")

    def _tell(self) -> None:
        """Tell every running batch that steps on by itself (worker_process.py) that the event loop has
        news for it: it answers after its current step."""
        for batch in self.running:
            tell = getattr(batch, "tell", None)
            if tell is not None:
                tell()

    def _queueing(self, job: Job) -> None:
        """A request waits: the running batches stepping on hear of it, and of its client going."""
        job.future.add_done_callback(self._told_if_gone)
        self._tell()

    def _told_if_gone(self, future: asyncio.Future) -> None:
        if future.cancelled():  # its client has gone: its sources leave at the next step
            self._tell()

    def _news(self, worker: int) -> bool:
        """Whether the event loop has something for this worker: a request waiting, work alone, a client
        gone. (Read from the worker's thread: each is one read of a value the loop sets.)"""
        gone = any(flight.job.future.done() for flight in list(self.flights[worker].values()))
        return (bool(self.queue) and not self._held(worker)) or self.pause is not None or gone

    def _held(self, worker: int) -> bool:
        """Whether the requests waiting wait for company before joining this worker's busy running
        batch (see HOLD_FROM; read from the worker's thread too: one read of each value)."""
        first = next(iter(self.queue), None)
        if first is None or first.work is not None or self.running[worker].sources < HOLD_FROM:
            return False
        return len(self.queue) < HOLD_GROUP and time.perf_counter() - first.queued < HOLD_S

    async def _run_alone(self, job: Job) -> None:
        """Pause every worker between iterations, run ``job.work`` on the first one's thread, go on."""
        assert job.work is not None
        self.queue.remove(job)
        self.pause = asyncio.get_running_loop().create_future()
        self._tell()
        try:
            while self.iterating:  # the other workers end their iteration, then wait for the pause
                await asyncio.sleep(0.001)
            if not job.future.done():
                await settle_with(job, self.threads[0], self._alone, job.work, job.inputs)
        finally:
            self.pause.set_result(None)
            self.pause = None
            self.progressed = time.monotonic()

    def _alone(self, work: Callable[..., Any], args: list[Any]) -> Any:
        self.prepared[0] = 1
        return super()._alone(work, args)


def _close(batch: RunningBatch) -> None:
    """Let a running batch go: one in a process of its own (worker_process.py) stops it."""
    close = getattr(batch, "close", None)
    if close is not None:
        close()
