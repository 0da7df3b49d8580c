"""What every endpoint of the server reads: one :class:`ServerState`, held on ``app.state.server``.

It holds the server's settings and metrics and, once the model has loaded (in a thread, after the server
starts), the model and the batcher that runs it. An endpoint asks it for the model (503 while it
loads), checks its inputs' lengths with it, and awaits its outputs through :meth:`ServerState.batched`,
which drops the request, or tells the model it is abandoned, when its client goes: the request waits
for whichever comes first, its answer or its client's disconnect (one wait on the ASGI server's
``receive``, no clock: it is dropped as soon as its client goes, where a check every quarter of a second
let it wait up to that long, and woke every waiting request four times a second).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from attnkit.errors import DataError
from attnkit.serve.batcher import Batcher
from attnkit.serve.batching import Batching, QueueFullError
from attnkit.serve.building import StepsBuilding
from attnkit.serve.continuous import ContinuousBatcher
from attnkit.serve.errors import RequestError
from attnkit.serve.metrics import Metrics
from attnkit.serve.served import ServedModel

WORKER_DEADLINE_STALLS = 2  # a worker process is ended when it has not answered for this many stall times
LOG = logging.getLogger("uvicorn.error")  # the server's log, beside uvicorn's own lines
# A request whose texts hold at most this many characters is tokenised on the event loop: a Multi30k
# sentence took 16 µs there against 109 µs through a thread (asyncio.to_thread's hop, most of it the
# server's CPU), and 1,000 characters about 0.2 ms, as long as the loop may be held; longer ones go to
# a thread.
INLINE_CHARACTERS = 1_000


@dataclass
class ServeSettings:
    """What ``attnkit serve``'s options set."""

    max_batch_tokens: int = 4096  # source tokens of all requests in one batch
    # token positions the rows of one batch hold at most: each row its input and the longest output it
    # may write (beam rows × (source + output bound); a prompt and its max_new_tokens)
    max_batch_positions: int = 65_536
    max_wait_ms: float = 0.0  # how long a batch waits for more requests after its first
    max_queue: int = 256  # requests waiting at most (explorer pages too); more are refused (503)
    api_key: str = ""  # when set, every endpoint but /health needs "Authorization: Bearer KEY"
    retry_after_s: int = 1  # what a 503 asks the client to wait
    max_body_bytes: int = 1_048_576  # a larger request body is refused (413) before it is read whole
    max_explore_tokens: int = 64  # /explore: tokens of the text (and of the output it shows), at most
    stall_after_s: float = 300.0  # /health says "stalled" when requests wait this long with no batch moving
    hosts: tuple[str, ...] = ()  # the Host header names accepted (empty: any)
    batching: str = "batches"  # "continuous": a running batch that requests join at any step (continuous.py)
    # "processes": each running batch in a process of its own where the model can be (worker_process.py);
    # "threads": on the batcher's threads, in this process
    workers: str = "threads"
    allocator: str | None = None  # the library worker processes preload as their allocator (cpu/allocator.py)


@dataclass
class ServerState:
    """The settings and metrics; the model and its batcher once loaded (``failed``: why it did not
    load). ``stopping()`` says whether the server is shutting down."""

    settings: ServeSettings
    stopping: Callable[[], bool] = lambda: False
    metrics: Metrics = field(default_factory=Metrics)
    model: ServedModel | None = None
    batcher: Batching | None = None
    failed: str | None = None
    building: StepsBuilding | None = None  # the model's compiled steps, being built (decode.steps=auto)

    def steps(self) -> str | None:
        """What the model's searches step with (``/health`` says it): ``compiled``, ``eager``, or
        ``compiling`` while its compiled steps are built; None for a model without the choice."""
        assert self.model is not None
        if self.building is not None and self.building.building:
            return "compiling"
        return self.model.steps()

    def batcher_for(self, model: ServedModel) -> Batching:
        """The batcher that will run ``model`` (made off the event loop: its workers' processes, where it
        has them, start loading the model now; ``batcher.started()`` waits for them)."""
        s = self.settings
        if s.batching == "continuous":
            # a worker process that has not answered a step for twice --stall-after is ended: /health has
            # said "stalled" meanwhile (an orchestrator may replace the server), and its requests get a 500
            deadline = WORKER_DEADLINE_STALLS * s.stall_after_s
            elsewhere = (
                model.running_batch_process(deadline, s.allocator) if s.workers == "processes" else None
            )
            return ContinuousBatcher(
                elsewhere or model.running_batch,
                max_batch_tokens=s.max_batch_tokens,
                max_batch_positions=s.max_batch_positions,
                max_queue=s.max_queue,
                workers=model.worker_processes() if elsewhere else model.streams,
                prepare=model.prepare_worker,
                observe=self.metrics.iteration,
            )
        return Batcher(model.run, max_batch_tokens=s.max_batch_tokens,
                       max_batch_positions=s.max_batch_positions, max_wait_ms=s.max_wait_ms,
                       max_queue=s.max_queue, workers=model.streams, prepare=model.prepare_worker,
                       observe=self.metrics.batch, abandon=model.abandon)  # fmt: skip

    def start(self, model: ServedModel, batcher: Batching) -> None:
        """Serve ``model`` with ``batcher`` (on the event loop): the batcher starts, and requests are
        answered."""
        batcher.start()
        self.model, self.batcher = model, batcher

    def ready_model(self) -> Any:
        """The model, or 503 (try again) while it loads."""
        if self.model is None:
            raise RequestError(503, "loading", self.failed or "the model is still loading", self._retry())
        return self.model

    async def token_counts(self, model: ServedModel, texts: list[str]) -> list[int]:
        """How many tokens each of a request's ``texts`` is (``model.tokens``): on the event loop for a
        short request, in a thread for a long one (:data:`INLINE_CHARACTERS`)."""
        if sum(len(text) for text in texts) <= INLINE_CHARACTERS:
            return model.tokens(texts)
        return await asyncio.to_thread(model.tokens, texts)

    def check_lengths(self, tokens: list[int], limit: int | None, field: str, unit: str = "tokens") -> None:
        """413 for an input longer than the model reads (``limit``; None: no limit but the budget), or a
        request over the server's budget; what an input costs is counted in ``unit`` (a captioner's
        images in regions, speech in annotations)."""
        if limit is not None and max(tokens) > limit:
            raise RequestError(
                413, "too_long", f"{field}: {max(tokens)} {unit}, more than the model's {limit}"
            )
        budget = self.settings.max_batch_tokens
        if sum(tokens) > budget:
            message = f"body: {sum(tokens)} {unit}, more than the server's --max-batch-tokens {budget}"
            raise RequestError(413, "too_long", message)

    def check_positions(self, positions: int) -> None:
        """413 for a request whose rows would hold more token positions than a batch may (each row its
        input and the longest output it may write: a beam multiplies the rows, ``max_tokens`` lengthens
        them)."""
        budget = self.settings.max_batch_positions
        if positions > budget:
            held = f"{positions:,} token positions (its rows' inputs and the longest outputs they may write)"
            message = f"body: {held}, more than the server's --max-batch-positions {budget:,}"
            raise RequestError(413, "too_much_work", message)

    def batched(
        self, request: Request, inputs: list[Any], settings: Hashable, tokens: int, positions: int
    ) -> Awaitable[Any]:
        """The outputs of ``inputs`` (``tokens`` of input, ``positions`` in their rows: see
        :meth:`check_positions`) once their batch has run (see :meth:`answered`)."""
        assert self.batcher is not None
        return self.answered(request, self.batcher.submit(inputs, settings, tokens, positions))

    async def answered(self, request: Request, work: Awaitable[Any]) -> Any:
        """What ``work`` (the batcher's answer to this request) gives; the request is dropped from the
        queue, or abandoned by its batch, if its client disconnects meanwhile."""
        waiting, gone = asyncio.ensure_future(work), asyncio.ensure_future(_disconnect(request))
        try:
            await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                raise RequestError(499, "client_gone", "the client disconnected")
            return waiting.result()
        except QueueFullError as full:
            raise RequestError(503, "queue_full", str(full), self._retry()) from None
        except RequestError:
            raise
        except DataError as error:  # an upload whose data breaks past its header (read on a worker)
            raise RequestError(422, "invalid_request", str(error)) from None
        except asyncio.CancelledError:
            if not self.stopping():  # a stream whose client has gone: its response is cancelled
                self.metrics.errors.labels("client_gone").inc()
                LOG.info("%s: the client disconnected; its request is dropped", request.url.path)
                raise
            # uvicorn cuts off what is left past the grace period of a SIGTERM
            message = "the server stopped before this request's turn came"
            raise RequestError(503, "shutting_down", message, self._retry()) from None
        except Exception as error:  # the model failed on this request's inputs: this request fails alone
            raise RequestError(500, "model_error", f"{type(error).__name__}: {error}") from None
        finally:  # answered, refused, or cut off (a server past its grace period): out of the queue
            waiting.cancel()
            gone.cancel()

    def _retry(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.retry_after_s)}


async def _disconnect(request: Request) -> None:
    """Returns when the client of ``request`` disconnects (the ASGI server's ``http.disconnect``; an
    ASGI server says it too once the response is sent, by when nobody waits for this). The body has been
    read: any other message is passed over."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def server_of(request: Request) -> ServerState:
    """The state of the server answering ``request``."""
    return request.app.state.server
