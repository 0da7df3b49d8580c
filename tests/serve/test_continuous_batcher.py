"""The continuous batcher alone (serve/continuous.py), with a stand-in running batch: requests join a running
batch at its next iteration, oldest first within the token budget (a large one is never overtaken),
spread over the workers; a request whose client has gone leaves the batch; a failing iteration answers
its requests with the error and the worker goes on; work alone runs while no iteration does."""

import asyncio
import threading
import time

import pytest

from attnkit.serve.batching import QueueFullError
from attnkit.serve.continuous import ContinuousBatcher


class Countdown:
    """Input ``"word:n"`` is done after n iterations, as ``"WORD"``; ``"boom"`` makes the iteration fail.
    Records what each iteration was handed."""

    def __init__(self):
        self.left, self.iterations, self.lock = {}, [], threading.Lock()

    @property
    def sources(self):
        return len(self.left)

    @property
    def rows(self):
        return len(self.left)

    def iterate(self, joining, leaving):
        time.sleep(0.002)  # a step takes time
        self.iterations.append(([x for _, x, _ in joining], set(leaving)))
        if any(x == "boom" for _, x, _ in joining):
            raise ValueError("boom is not a sentence")
        for key in leaving:
            self.left.pop(key, None)
        for key, x, _ in joining:
            word, n = x.split(":")
            self.left[key] = [word.upper(), int(n)]
        done = []
        for key, state in list(self.left.items()):
            state[1] -= 1
            if state[1] <= 0:
                done.append((key, state[0]))
                del self.left[key]
        return done


def _batcher(running, **settings):
    made = iter(running)
    settings = {"max_batch_tokens": 100, "max_queue": 16, **settings}
    return ContinuousBatcher(lambda: next(made), **settings)


def test_requests_join_at_the_next_iteration_and_leave_when_done():
    countdown = Countdown()

    async def go():
        batcher = _batcher([countdown])
        batcher.start()
        long = asyncio.ensure_future(batcher.submit(["a:100"], None, 1))
        await asyncio.sleep(0.02)  # the long one runs alone, then a short one joins it
        short = await batcher.submit(["b:1", "c:2"], None, 2)
        assert not long.done()  # the short request did not wait for the long one
        result = await long, short
        await batcher.stop()
        return result

    assert asyncio.run(go()) == (["A"], ["B", "C"])
    joined = [x for joining, _ in countdown.iterations for x in joining]
    assert joined == ["a:100", "b:1", "c:2"]


def test_the_oldest_request_that_does_not_fit_is_not_overtaken():
    countdown = Countdown()

    async def go():
        batcher = _batcher([countdown], max_batch_tokens=10)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(["a:3"], None, 6))
        await asyncio.sleep(0.01)
        big = asyncio.ensure_future(batcher.submit(["big:1"], None, 8))  # 6 + 8 > 10: waits
        small = asyncio.ensure_future(batcher.submit(["s:1"], None, 1))  # would fit, but came later
        answers = await asyncio.gather(first, big, small)
        await batcher.stop()
        return answers

    results = asyncio.run(go())
    assert results == [["A"], ["BIG"], ["S"]]
    order = [x for joining, _ in countdown.iterations for x in joining]
    assert order == ["a:3", "big:1", "s:1"]
    assert not any("big:1" in joining and "a:3" in joining for joining, _ in countdown.iterations)


def test_a_running_batch_admits_no_more_token_positions_than_its_budget():
    countdown = Countdown()

    async def go():
        batcher = _batcher([countdown], max_batch_positions=1000)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(["a:3"], None, 1, 600))
        await asyncio.sleep(0.001)
        # one token each, but 600 positions (a wide beam, a long output): the second waits for the first
        second = asyncio.ensure_future(batcher.submit(["b:1"], None, 1, 600))
        third = asyncio.ensure_future(batcher.submit(["c:1"], None, 1, 300))
        answers = await asyncio.gather(first, second, third)
        await batcher.stop()
        return answers

    assert asyncio.run(go()) == [["A"], ["B"], ["C"]]
    joined = [joining for joining, _ in countdown.iterations if joining]
    assert joined[0] == ["a:3"] and not any("a:3" in j and "b:1" in j for j in joined)


def test_a_gone_client_leaves_the_batch_and_a_failure_answers_only_its_batch():
    running = [Countdown(), Countdown()]

    async def go():
        batcher = _batcher(running, workers=2)
        batcher.start()
        gone = asyncio.ensure_future(batcher.submit(["g:50"], None, 1))
        await asyncio.sleep(0.02)
        gone.cancel()
        await asyncio.sleep(0.02)
        with pytest.raises(ValueError, match="boom"):
            await batcher.submit(["boom"], None, 1)
        after = await batcher.submit(["x:2"], None, 1)  # the failed worker starts afresh
        await batcher.stop()
        return after

    running.append(Countdown())  # the fresh countdown after the failure
    assert asyncio.run(go()) == ["X"]
    left = [leaving for countdown in running for _, leaving in countdown.iterations if leaving]
    assert len(left) == 1 and len(next(iter(left))) == 1  # g's one input left, once
    assert not running[0].left and not running[1].left


def test_work_alone_runs_while_no_iteration_does_and_a_full_queue_refuses():
    countdown, seen = Countdown(), []

    def alone(x):
        seen.append((x, countdown.sources))  # between two iterations of a running batch
        return x * 2

    async def go():
        batcher = _batcher([countdown], max_queue=2)
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(["a:30"], None, 1))
        await asyncio.sleep(0.01)
        doubled = await batcher.alone(alone, 21)
        # three at once, while an iteration runs: two wait, the third finds the queue full
        asked = [batcher.submit([f"q{i}:1"], None, 1) for i in range(3)]
        answers = await asyncio.gather(running, *asked, return_exceptions=True)
        await batcher.stop()
        return doubled, answers

    doubled, answers = asyncio.run(go())
    assert doubled == 42 and seen == [(21, 1)]
    assert answers[:3] == [["A"], ["Q0"], ["Q1"]] and isinstance(answers[3], QueueFullError)


def test_a_long_running_batch_is_not_taken_for_a_stalled_one():
    """One request stepped for a long time (its worker goes on without a hop to the event loop) still
    shows progress at every step: /health's stall clock does not run meanwhile."""
    countdown = Countdown()

    async def go():
        batcher = _batcher([countdown])
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(["a:150"], None, 1))  # 150 steps of 2 ms or more
        await asyncio.sleep(0.25)
        stalled = batcher.stalled_for()
        assert not running.done()
        await running
        await batcher.stop()
        return stalled

    assert asyncio.run(go()) < 0.1


def test_newcomers_to_a_busy_running_batch_wait_a_little_for_company_and_join_together():
    """A newcomer's first step costs about a step of the whole batch: while the batch runs HOLD_FROM
    sources or more, newcomers that come one by one join together, after at most about HOLD_S; a
    batch with fewer sources takes each at once."""
    from attnkit.serve.continuous import HOLD_FROM, HOLD_S

    countdown = Countdown()

    async def go():
        batcher = _batcher([countdown])
        batcher.start()
        # a busy batch: HOLD_FROM long sources; then newcomers one at a time, a step apart
        long = asyncio.ensure_future(batcher.submit([f"l{i}:1000" for i in range(HOLD_FROM)], None, 4))
        await asyncio.sleep(0.02)
        began = time.perf_counter()
        newcomers = []
        for i in range(3):
            newcomers.append(asyncio.ensure_future(batcher.submit([f"n{i}:1"], None, 1)))
            await asyncio.sleep(0.003)
        answered = await asyncio.gather(*newcomers)
        waited = time.perf_counter() - began
        long.cancel()
        await batcher.stop()
        return answered, waited

    answered, waited = asyncio.run(go())
    assert answered == [["N0"], ["N1"], ["N2"]]
    joins = [joining for joining, _ in countdown.iterations if joining]
    assert joins[0] == [f"l{i}:1000" for i in range(HOLD_FROM)]
    assert joins[1] == ["n0:1", "n1:1", "n2:1"]  # together, at one iteration
    assert waited < HOLD_S + 0.1  # the first waited at most about HOLD_S


def test_a_running_batch_of_few_sources_takes_newcomers_at_once():
    countdown = Countdown()

    async def go():
        batcher = _batcher([countdown])
        batcher.start()
        long = asyncio.ensure_future(batcher.submit(["l:1000"], None, 1))
        await asyncio.sleep(0.02)
        for i in range(2):
            await batcher.submit([f"n{i}:1"], None, 1)
        long.cancel()
        await batcher.stop()

    asyncio.run(go())
    joins = [joining for joining, _ in countdown.iterations if joining]
    assert joins == [["l:1000"], ["n0:1"], ["n1:1"]]  # one by one, each at the next iteration
