"""A running batch in a process of its own (serve/engine_process.py), with stand-in engines built in the
child: it steps as the engine does; streamed pieces reach their sinks; the child's torch threads follow
the caller's; a failing iteration, a killed child or one that cannot load is an ``EngineError``, and the
continuous batcher answers with it and goes on with a new process; ``close`` ends the child."""

import asyncio
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from functools import partial

import pytest
import torch

from attnkit.serve.continuous import ContinuousBatcher
from attnkit.serve.engine_process import EngineError, EngineProcess


class Countdown:
    """``"word:n"`` is done after n steps as ``"WORD"``; ``"threads"`` at once, as the child's torch
    threads; ``"boom"`` fails the step; a prompt (``.text``, ``.sink``) hears ``"<text>1"``, ``"<text>2"``
    ... one piece a step, and is done after ``seed`` steps with them joined."""

    def __init__(self):
        self.left = {}

    @property
    def sources(self):
        return len(self.left)

    @property
    def rows(self):
        return 2 * len(self.left)

    def iterate(self, joining, leaving):
        for key in leaving:
            self.left.pop(key, None)
        for key, x, _ in joining:
            if x == "boom":
                raise ValueError("boom is not a sentence")
            if x == "threads":
                self.left[key] = [str(torch.get_num_threads()), 1, None, None]
            elif isinstance(x, str):
                word, n = x.split(":")
                self.left[key] = [word.upper(), int(n), None, None]
            else:
                self.left[key] = [x.text, x.seed, x.sink, []]
        done = []
        for key, state in list(self.left.items()):
            text, _, sink, pieces = state  # pieces: None for a text
            if pieces is not None:
                pieces.append(f"{text}{len(pieces) + 1}")
                if sink is not None:
                    sink(pieces[-1])
            state[1] -= 1
            if state[1] <= 0:
                done.append((key, text if pieces is None else "".join(pieces)))
                del self.left[key]
        return done


def cannot_load():
    raise FileNotFoundError("no such checkpoint: /nowhere")


@dataclass
class Prompt:
    """As the server's prompt: what does not travel (a thread event) beside what does."""

    text: str
    seed: int
    sink: object = None
    gone: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def engine():
    process = EngineProcess(Countdown)
    yield process
    process.close()


def test_an_engine_process_steps_its_running_batch_as_the_engine_would(engine):
    assert engine.iterate([(1, "a:3", None), (2, "b:1", None)], set()) == [(2, "B")]
    assert (engine.sources, engine.rows) == (1, 2)
    assert engine.iterate([(3, "c:1", None)], set()) == [(3, "C")]
    assert engine.iterate([], set()) == [(1, "A")]
    assert (engine.sources, engine.rows) == (0, 0)
    engine.iterate([(4, "d:5", None)], set())
    assert engine.iterate([], {4}) == [] and engine.sources == 0  # left: not stepped again


def test_streamed_pieces_reach_their_sinks_with_the_step_that_made_them(engine):
    heard = []
    prompt = Prompt("x", 3, sink=heard.append)
    silent = Prompt("y", 2)
    assert engine.iterate([(1, prompt, None), (2, silent, None)], set()) == []
    assert heard == ["x1"]
    assert engine.iterate([], set()) == [(2, "y1y2")]
    assert heard == ["x1", "x2"]
    assert engine.iterate([], set()) == [(1, "x1x2x3")]
    assert heard == ["x1", "x2", "x3"] and not engine.sinks  # a done prompt's sink is let go


def test_the_child_steps_on_as_many_threads_as_the_calling_thread_has(engine):
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            assert engine.iterate([(threads, "threads", None)], set()) == [(threads, str(threads))]
    finally:
        torch.set_num_threads(before)


def test_a_failing_step_fails_the_iteration_and_ends_the_child(engine):
    engine.iterate([(1, "a:5", None)], set())
    with pytest.raises(EngineError, match="ValueError: boom is not a sentence"):
        engine.iterate([(2, "boom", None)], set())
    with pytest.raises(EngineError, match="the engine process is gone"):
        engine.iterate([], set())


def test_a_killed_child_fails_the_next_iteration_in_one_line(engine):
    engine.started()
    os.kill(engine.process.pid, signal.SIGKILL)
    with pytest.raises(EngineError, match=r"the engine process is gone \(exit code -9\)"):
        engine.iterate([(1, "a:1", None)], set())


def test_a_child_that_cannot_load_its_model_says_why():
    process = EngineProcess(cannot_load)
    try:
        said = "could not load the model: FileNotFoundError: no such checkpoint"
        with pytest.raises(EngineError, match=said):
            process.started()
    finally:
        process.close()


def test_where_one_of_two_processes_cannot_load_the_batcher_says_why_and_ends_the_other():
    builds = iter([partial(Countdown), cannot_load])
    made = []

    def new_engine():
        made.append(EngineProcess(next(builds)))
        return made[-1]

    batcher = ContinuousBatcher(new_engine, max_batch_tokens=100, max_queue=16, workers=2)
    try:
        made[0].started()  # the first has loaded its model
        with pytest.raises(EngineError, match="could not load the model: FileNotFoundError"):
            batcher.started()
        for process in made:  # neither is left idle until the server exits
            process.process.join(timeout=10)
            assert not process.process.is_alive()
    finally:
        for process in made:
            process.close()


def test_close_ends_the_child(engine):
    engine.started()
    engine.close()
    assert not engine.process.is_alive()


def test_the_batcher_answers_a_failed_process_and_goes_on_with_a_new_one():
    made = []

    def new_engine():
        made.append(EngineProcess(partial(Countdown)))
        return made[-1]

    async def go():
        batcher = ContinuousBatcher(new_engine, max_batch_tokens=100, max_queue=16)
        await asyncio.get_running_loop().run_in_executor(None, batcher.started)
        batcher.start()
        try:
            long = asyncio.ensure_future(batcher.submit(["a:1000000"], None, 1))
            await asyncio.sleep(0.3)
            os.kill(made[0].process.pid, signal.SIGKILL)
            with pytest.raises(EngineError, match="exit code -9"):
                await long
            assert await batcher.submit(["b:2", "c:1"], None, 2) == ["B", "C"]  # a new child took over
            assert len(made) == 2 and not made[0].process.is_alive()
        finally:
            await batcher.stop()
        return made

    began = time.monotonic()
    for process in asyncio.run(go()):
        assert not process.process.is_alive()  # stop ends the children
    assert time.monotonic() - began < 60
