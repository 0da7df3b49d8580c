"""The dynamic batcher alone (in one process, a stand-in for the model): requests that arrive together
share a batch up to the token budget, other settings never share a search, a failing request fails
alone, a full queue refuses at once, and a request whose client has gone is not run."""

import asyncio

import pytest

from attnkit.serve.batcher import Batcher, QueueFullError


class Model:
    """Upper-cases its inputs and records every batch it is given; an input "boom" makes it raise."""

    def __init__(self):
        self.batches = []

    def run(self, inputs, settings):
        self.batches.append((list(inputs), settings))
        if "boom" in inputs:
            raise ValueError("boom is not a sentence")
        return [f"{x.upper()}/{settings}" for x in inputs]


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
