"""The dynamic batcher alone (in one process, a stand-in for the model): requests that arrive together
share a batch up to the token budget, other settings never share a search, a failing request fails
alone, a full queue refuses at once, and a request whose client has gone is not run."""

import asyncio
import threading
import time

import pytest

from attnkit.serve.batcher import Batcher
from attnkit.serve.batching import QueueFullError


class Model:
    """Upper-cases its inputs and records every batch it is given; an input "boom" makes it raise."""

    def __init__(self):
        self.batches = []

    def run(self, inputs, settings):
        self.batches.append((list(inputs), settings))
        if "boom" in inputs:
            raise ValueError("boom is not a sentence")
        return [f"{x.upper()}/{settings}" for x in inputs]


class Held:
    """A model whose batches wait until ``release`` is set (5 s at most), then echo their inputs."""

    def __init__(self):
        self.release = threading.Event()

    def run(self, inputs, settings):
        self.release.wait(5)
        return inputs


def _serve(model, **limits):
    async def go(requests):
        batcher = Batcher(
            model.run, **{"max_batch_tokens": 100, "max_wait_ms": 50, "max_queue": 64, **limits}
        )
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit(*r) for r in requests), return_exceptions=True)
        finally:
            await batcher.stop()

    return go


def test_requests_arriving_together_share_a_batch_up_to_the_token_budget():
    model = Model()
    requests = [([f"s{i}"], "beam1", 30) for i in range(5)]  # 30 tokens each, 100 a batch: 3 + 2
    answers = asyncio.run(_serve(model)(requests))
    assert answers == [[f"S{i}/beam1"] for i in range(5)]
    assert [len(inputs) for inputs, _ in model.batches] == [3, 2]


def test_a_batch_holds_no_more_token_positions_than_its_budget():
    model = Model()
    # few tokens each, but beams and outputs make them 400 positions: 1,000 a batch hold two at a time
    requests = [([f"s{i}"], "beam64", 2, 400) for i in range(5)]
    answers = asyncio.run(_serve(model, max_batch_positions=1000)(requests))
    assert answers == [[f"S{i}/beam64"] for i in range(5)]
    assert [len(inputs) for inputs, _ in model.batches] == [2, 2, 1]


def test_other_settings_share_the_wait_but_not_the_search():
    model = Model()
    requests = [(["a"], "beam1", 1), (["b"], "beam5", 1), (["c"], "beam1", 1)]
    answers = asyncio.run(_serve(model)(requests))
    assert answers == [["A/beam1"], ["B/beam5"], ["C/beam1"]]
    assert sorted(model.batches) == [(["a", "c"], "beam1"), (["b"], "beam5")]


def test_a_request_that_makes_the_model_fail_fails_alone():
    model = Model()
    answers = asyncio.run(_serve(model)([(["x"], "s", 1), (["boom"], "s", 1), (["y", "z"], "s", 2)]))
    assert answers[0] == ["X/s"] and answers[2] == ["Y/s", "Z/s"]
    assert isinstance(answers[1], ValueError) and "boom" in str(answers[1])


def test_a_full_queue_refuses_at_once():
    async def go():
        batcher = Batcher(Model().run, max_batch_tokens=100, max_wait_ms=0, max_queue=2)  # not started yet
        first = asyncio.ensure_future(batcher.submit(["a"], "s", 1))
        second = asyncio.ensure_future(batcher.submit(["b"], "s", 1))
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError, match="2 requests are already waiting"):
            await batcher.submit(["c"], "s", 1)
        batcher.start()
        assert await first == ["A/s"] and await second == ["B/s"]
        await batcher.stop()

    asyncio.run(go())


def test_a_request_whose_client_has_gone_is_not_run():
    async def go():
        model = Model()
        batcher = Batcher(model.run, max_batch_tokens=100, max_wait_ms=50, max_queue=8)
        gone = asyncio.ensure_future(batcher.submit(["gone"], "s", 1))
        kept = asyncio.ensure_future(batcher.submit(["kept"], "s", 1))
        await asyncio.sleep(0)
        gone.cancel()  # the client disconnected before its batch began
        batcher.start()
        assert await kept == ["KEPT/s"]
        await batcher.stop()
        return model.batches

    assert asyncio.run(go()) == [(["kept"], "s")]


class Meeting:
    """A model whose batches each wait (up to 5 s) for another batch to be running at the same time,
    and record when they ran; ``alone`` work records when it ran too."""

    def __init__(self, parties):
        self.barrier, self.spans = threading.Barrier(parties, timeout=5), []

    def run(self, inputs, settings):
        began = time.perf_counter()
        try:
            self.barrier.wait()
            met = True
        except threading.BrokenBarrierError:
            met = False
        time.sleep(0.05)
        self.spans.append(("batch", began, time.perf_counter()))
        return [met] * len(inputs)

    def explore(self):
        began = time.perf_counter()
        time.sleep(0.05)
        self.spans.append(("alone", began, time.perf_counter()))
        return "page"


def test_two_workers_run_two_batches_at_once_and_alone_work_overlaps_none():
    """The first batch waits for a second to run beside it: with two workers it does (with one, it
    would wait 5 s and give up). The explorer's work, asked meanwhile, runs when neither runs."""

    async def go():
        model, prepared = Meeting(2), []
        batcher = Batcher(model.run, max_batch_tokens=1, max_wait_ms=0, max_queue=8, workers=2,
                          prepare=prepared.append)  # fmt: skip
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(["a"], "s", 1))
        second = asyncio.ensure_future(
            batcher.submit(["b"], "s", 1)
        )  # over the budget of 1: a batch of its own
        await asyncio.sleep(0.01)
        page = await batcher.alone(model.explore)
        answers = await asyncio.gather(first, second)
        await batcher.stop()
        return model.spans, page, answers, prepared

    spans, page, answers, prepared = asyncio.run(go())
    assert answers == [[True], [True]] and page == "page"
    assert prepared == [1, 2, 1]  # the first batch alone, the second beside it, the explorer's work alone
    (alone,) = [span for span in spans if span[0] == "alone"]
    for kind, began, ended in spans:
        if kind == "batch":
            assert ended <= alone[1] or began >= alone[2], "the explorer's work overlapped a batch"


def test_one_worker_runs_one_batch_at_a_time():
    async def go():
        model = Meeting(2)
        batcher = Batcher(model.run, max_batch_tokens=1, max_wait_ms=0, max_queue=8, workers=1)
        batcher.start()
        answers = await asyncio.gather(batcher.submit(["a"], "s", 1), batcher.submit(["b"], "s", 1))
        await batcher.stop()
        return answers

    model_answers = asyncio.run(go())
    assert model_answers[0] == [False]  # nobody came: the second batch waited for the first


def test_stop_drops_the_requests_still_queued():
    """What is still queued when the server stops the batcher has no client left (see Batcher.stop)."""

    async def go():
        batcher = Batcher(Model().run, max_batch_tokens=100, max_wait_ms=0, max_queue=8)
        left = asyncio.ensure_future(batcher.submit(["left"], "s", 1))  # never started: stays queued
        await asyncio.sleep(0)
        await batcher.stop()
        with pytest.raises(asyncio.CancelledError):
            await left

    asyncio.run(go())


def test_a_request_waiting_for_a_busy_worker_is_counted_as_waiting_and_dropped_on_stop():
    """The oldest request waits for a worker outside the queue: it still counts as waiting (the
    --max-queue limit and /metrics' queue gauge count it), and stopping the batcher drops it rather than
    leaving its client waiting for ever."""

    async def go():
        held = Held()
        run, release = held.run, held.release

        batcher = Batcher(run, max_batch_tokens=1, max_wait_ms=0, max_queue=1, workers=1)
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(["a"], "s", 1))
        await asyncio.sleep(0.05)  # "a" runs: the one worker is busy
        held = asyncio.ensure_future(batcher.submit(["b"], "s", 1))
        await asyncio.sleep(0.05)  # "b" is the next batch's first request, waiting for the worker
        counted = batcher.waiting()
        with pytest.raises(QueueFullError, match="1 requests are already waiting"):
            await batcher.submit(["c"], "s", 1)
        stopping = asyncio.ensure_future(batcher.stop())
        await asyncio.sleep(0.05)
        release.set()  # "a" ends; the batcher stops
        await stopping
        done, _ = await asyncio.wait([held], timeout=1)
        return counted, await running, held in done and held.cancelled()

    counted, answered, dropped = asyncio.run(go())
    assert counted == 1 and answered == ["a"] and dropped


def test_two_alone_works_amid_batches_on_two_workers_never_deadlock():
    """Two explorers asking while batches run on two workers: each used to take one worker's permit and
    wait for the other's for ever, and every later request queued behind them. Queued as requests of
    their own, both run, and so does a request that comes after them."""

    async def go():
        def run(inputs, settings):
            time.sleep(0.01)
            return inputs

        def explore(name):
            time.sleep(0.01)
            return name

        batcher = Batcher(run, max_batch_tokens=1, max_wait_ms=0, max_queue=200, workers=2)
        batcher.start()
        asked = []
        for round in range(20):
            asked += [batcher.submit([f"t{round}{i}"], "s", 1) for i in range(4)]
            asked += [batcher.alone(explore, f"e{round}{i}") for i in range(2)]
        answers = await asyncio.wait_for(asyncio.gather(*asked), 20)
        last = await asyncio.wait_for(batcher.submit(["last"], "s", 1), 5)
        await batcher.stop()
        return answers, last

    answers, last = asyncio.run(go())
    assert len(answers) == 120 and last == ["last"]


def test_alone_work_waits_its_turn_in_the_queue_and_counts_towards_max_queue():
    async def go():
        held = Held()
        run, release = held.run, held.release

        batcher = Batcher(run, max_batch_tokens=1, max_wait_ms=0, max_queue=2, workers=1)
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(["a"], "s", 1))
        await asyncio.sleep(0.05)
        explored = asyncio.ensure_future(batcher.alone(lambda: "page"))
        queued = asyncio.ensure_future(batcher.submit(["b"], "s", 1))
        await asyncio.sleep(0.05)
        counted = batcher.waiting()
        with pytest.raises(QueueFullError):
            await batcher.alone(lambda: "another page")
        release.set()
        answers = await asyncio.gather(running, explored, queued)
        await batcher.stop()
        return counted, answers

    counted, answers = asyncio.run(go())
    assert counted == 2 and answers == [["a"], "page", ["b"]]


def test_stalled_for_counts_while_requests_wait_without_a_batch_starting_or_ending():
    async def go():
        held = Held()
        run, release = held.run, held.release

        batcher = Batcher(run, max_batch_tokens=1, max_wait_ms=0, max_queue=8, workers=1)
        batcher.start()
        idle = batcher.stalled_for()
        await asyncio.sleep(0.2)
        still_idle = batcher.stalled_for()
        running = asyncio.ensure_future(batcher.submit(["a"], "s", 1))
        await asyncio.sleep(0.3)
        stuck = batcher.stalled_for()
        release.set()
        await running
        done = batcher.stalled_for()
        await batcher.stop()
        return idle, still_idle, stuck, done

    idle, still_idle, stuck, done = asyncio.run(go())
    assert idle == still_idle == 0 and stuck >= 0.25 and done == 0


def test_a_request_whose_client_goes_while_its_batch_runs_is_abandoned():
    """The model hears of the inputs of a request cancelled mid-batch (a generator stops extending them)."""

    async def go():
        held, abandoned = Held(), []
        run, release = held.run, held.release

        batcher = Batcher(run, max_batch_tokens=10, max_wait_ms=0, max_queue=8, abandon=abandoned.extend)
        batcher.start()
        gone = asyncio.ensure_future(batcher.submit(["gone"], "s", 1))
        kept = asyncio.ensure_future(batcher.submit(["kept"], "s", 1))
        await asyncio.sleep(0.05)
        gone.cancel()
        await asyncio.sleep(0.01)
        heard = list(abandoned)
        release.set()
        answer = await kept
        await batcher.stop()
        return heard, answer

    heard, answer = asyncio.run(go())
    assert heard == ["gone"] and answer == ["kept"]
