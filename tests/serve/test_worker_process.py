"""A running batch in a process of its own (serve/worker_process.py), with stand-in running batches
built in the child: it steps as the running batch does; streamed pieces reach their sinks; the child's
torch threads follow the caller's; a failing iteration, a killed child or one that cannot load is a
``WorkerError``, and the
continuous batcher answers with it and goes on with a new process; ``close`` ends the child. A child
that answers no step within its deadline is ended and its requests told so; one hung worker shows in
the batcher's stall clock while the others go on, and does not keep the batcher from stopping; a
child that died while it held nothing is replaced without a failed request; a child ignores SIGINT
and SIGTERM (the server ends it). The child steps on by itself until a source is done, a stream has a
piece, its time is up or it is told of news: a request that comes meanwhile joins at the next step, a
client that goes leaves, and a newcomer held for company joins once its wait is over."""

import asyncio
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import torch

from attnkit.serve import worker_process
from attnkit.serve.continuous import HOLD_FROM, HOLD_S, ContinuousBatcher
from attnkit.serve.worker_process import WorkerError, WorkerGoneError, WorkerProcess


class Countdown:
    """``"word:n"`` is done after n steps as ``"WORD"``; ``"threads"`` at once, as the child's torch
    threads; ``"mapped:NAME"`` at once, as whether a library of that name is mapped in the child;
    ``"boom"`` fails the step; ``"crash"`` crashes the child (SIGSEGV); a prompt (``.text``, ``.sink``)
    hears ``"<text>1"``, ``"<text>2"`` ... one piece a step, and is done after ``seed`` steps with them
    joined. A step takes ``step_s`` seconds."""

    def __init__(self, step_s=0.0):
        self.left, self.step_s = {}, step_s

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
            if x == "crash":  # a crash in native code: reading address 0
                import ctypes

                ctypes.string_at(0)
            if x == "threads":
                self.left[key] = [str(torch.get_num_threads()), 1, None, None]
            elif isinstance(x, str) and x.startswith("mapped:"):  # whether a library is in this process
                mapped = x.partition(":")[2] in Path("/proc/self/maps").read_text(encoding="utf-8")
                self.left[key] = ["MAPPED" if mapped else "NOT MAPPED", 1, None, None]
            elif isinstance(x, str):
                word, n = x.split(":")
                self.left[key] = [word.upper(), int(n), None, None]
            else:
                self.left[key] = [x.text, x.seed, x.sink, []]
        time.sleep(self.step_s)
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
def worker():
    process = WorkerProcess(Countdown)
    yield process
    process.close()


def test_a_worker_process_steps_its_running_batch_as_the_batch_itself_would(worker):
    assert worker.iterate([(1, "a:3", None), (2, "b:1", None)], set()) == [(2, "B")]
    assert (worker.sources, worker.rows) == (1, 2)
    assert worker.iterate([(3, "c:1", None)], set()) == [(3, "C")]
    assert worker.iterate([], set()) == [(1, "A")]
    assert (worker.sources, worker.rows) == (0, 0)
    worker.iterate([(4, "d:5", None)], set())
    assert worker.iterate([], {4}) == [] and worker.sources == 0  # left: not stepped again


def test_the_child_steps_on_by_itself_until_a_source_is_done(worker):
    endless = float("inf")
    assert worker.steps_on([(1, "a:30", None), (2, "b:50", None)], set(), lambda: endless)[:2] == (
        [(1, "A")], 30)  # fmt: skip
    assert worker.steps_on([], set(), lambda: endless)[:2] == ([(2, "B")], 20)
    assert worker.steps_on([(3, "c:5", None)], set(), lambda: 0.0)[:2] == ([], 1)  # no time: one step
    assert worker.steps_on([], {3}, lambda: endless)[:2] == ([], 1) and worker.sources == 0  # none left


def test_a_child_stepping_on_answers_when_told_or_when_its_time_is_up():
    process = WorkerProcess(partial(Countdown, step_s=0.01))
    try:
        process.started()  # (the child's start, an interpreter and torch loading, is not what is timed)
        began = time.monotonic()
        done, steps, _ = process.steps_on([(1, "a:10000", None)], set(), lambda: 0.2)
        assert done == [] and 5 <= steps <= 25 and time.monotonic() - began < 2  # its 0.2 s, then it answers
        threading.Timer(0.2, process.tell).start()
        began = time.monotonic()
        done, steps, _ = process.steps_on([], set(), lambda: float("inf"))
        assert done == [] and 5 <= steps <= 60 and time.monotonic() - began < 2  # told after 0.2 s
        process.tell()  # news told before the next call do not cut it short: the flag starts clear
        assert process.steps_on([(2, "b:3", None)], set(), lambda: float("inf"))[:2] == ([(2, "B")], 3)
    finally:
        process.close()


def test_a_streaming_prompt_has_its_piece_at_every_step_while_the_child_steps_on(worker):
    heard = []
    prompt = Prompt("x", 3, sink=heard.append)
    assert worker.steps_on([(1, prompt, None)], set(), lambda: float("inf"))[:2] == ([], 1)
    assert heard == ["x1"]


def test_streamed_pieces_reach_their_sinks_with_the_step_that_made_them(worker):
    heard = []
    prompt = Prompt("x", 3, sink=heard.append)
    silent = Prompt("y", 2)
    assert worker.iterate([(1, prompt, None), (2, silent, None)], set()) == []
    assert heard == ["x1"]
    assert worker.iterate([], set()) == [(2, "y1y2")]
    assert heard == ["x1", "x2"]
    assert worker.iterate([], set()) == [(1, "x1x2x3")]
    assert heard == ["x1", "x2", "x3"] and not worker.sinks  # a done prompt's sink is let go


def test_the_child_steps_on_as_many_threads_as_the_calling_thread_has(worker):
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            assert worker.iterate([(threads, "threads", None)], set()) == [(threads, str(threads))]
    finally:
        torch.set_num_threads(before)


def test_a_failing_step_fails_the_iteration_and_ends_the_child(worker):
    worker.iterate([(1, "a:5", None)], set())
    with pytest.raises(WorkerError, match="ValueError: boom is not a sentence"):
        worker.iterate([(2, "boom", None)], set())
    with pytest.raises(WorkerError, match="the worker process is gone"):
        worker.iterate([], set())


def test_a_killed_child_fails_the_next_iteration_in_one_line(worker):
    worker.started()
    os.kill(worker.process.pid, signal.SIGKILL)
    with pytest.raises(WorkerError, match=r"the worker process is gone \(ended by SIGKILL\): "):
        worker.iterate([(1, "a:1", None)], set())


def test_a_child_that_crashes_in_native_code_says_so_and_leaves_its_stack_on_standard_error(capfd):
    worker = WorkerProcess(Countdown)  # started inside capfd: its standard error is the one captured
    try:
        worker.iterate([(1, "a:5", None)], set())
        crashed = r"the worker process is gone \(ended by SIGSEGV \(a crash; its stack is in the server's log"
        with pytest.raises(WorkerGoneError, match=crashed):
            worker.iterate([(2, "crash", None)], set())
    finally:
        worker.close()
    said = capfd.readouterr().err
    assert "Fatal Python error: Segmentation fault" in said
    assert "in iterate" in said and "_child" in said  # where it crashed, through the child's loop


def test_a_child_that_cannot_load_its_model_says_why():
    process = WorkerProcess(cannot_load)
    try:
        said = "could not load the model: FileNotFoundError: no such checkpoint"
        with pytest.raises(WorkerError, match=said):
            process.started()
    finally:
        process.close()


def test_where_one_of_two_processes_cannot_load_the_batcher_says_why_and_ends_the_other():
    builds = iter([partial(Countdown), cannot_load])
    made = []

    def new_running_batch():
        made.append(WorkerProcess(next(builds)))
        return made[-1]

    batcher = ContinuousBatcher(new_running_batch, max_batch_tokens=100, max_queue=16, workers=2)
    try:
        made[0].started()  # the first has loaded its model
        with pytest.raises(WorkerError, match="could not load the model: FileNotFoundError"):
            batcher.started()
        for process in made:  # neither is left idle until the server exits
            process.process.join(timeout=10)
            assert not process.process.is_alive()
    finally:
        for process in made:
            process.close()


def test_close_ends_the_child(worker):
    worker.started()
    worker.close()
    assert not worker.process.is_alive()


def _batcher_of_processes(
    deadline_s: float = 300.0, step_s: float = 0.0, **settings
) -> tuple[ContinuousBatcher, list]:
    """A continuous batcher whose running batches are countdowns (each step ``step_s`` seconds) in
    processes of their own, and the list of the processes it makes, in order."""
    made = []

    def new_running_batch():
        made.append(WorkerProcess(partial(Countdown, step_s=step_s), deadline_s=deadline_s))
        return made[-1]

    return ContinuousBatcher(
        new_running_batch, **{"max_batch_tokens": 100, "max_queue": 16, **settings}
    ), made


async def _started(batcher: ContinuousBatcher) -> ContinuousBatcher:
    await asyncio.get_running_loop().run_in_executor(None, batcher.started)
    batcher.start()
    return batcher


def test_the_batcher_answers_a_failed_process_and_goes_on_with_a_new_one():
    batcher, made = _batcher_of_processes()

    async def go():
        await _started(batcher)
        try:
            long = asyncio.ensure_future(batcher.submit(["a:1000000"], None, 1))
            await asyncio.sleep(0.3)
            os.kill(made[0].process.pid, signal.SIGKILL)
            with pytest.raises(WorkerError, match=r"ended by SIGKILL"):
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


def test_a_request_that_comes_while_a_child_steps_on_joins_at_its_next_step(monkeypatch):
    monkeypatch.setattr(worker_process, "STEP_ON_S", 10.0)  # untold, the child would step on past the end
    batcher, _ = _batcher_of_processes(step_s=0.01)

    async def go():
        await _started(batcher)
        try:
            long = asyncio.ensure_future(batcher.submit(["a:300"], None, 1))  # 3 s of steps
            await asyncio.sleep(0.3)
            began = time.monotonic()
            assert await batcher.submit(["b:2"], None, 1) == ["B"]
            quick = time.monotonic() - began  # two steps, once the child heard of it
            gone = asyncio.ensure_future(batcher.submit(["c:100000"], None, 1))
            await asyncio.sleep(0.3)
            gone.cancel()  # its client goes: the child hears of it, and its source leaves
            await asyncio.sleep(0.3)
            assert await batcher.submit(["d:1"], None, 1) == ["D"]
            left = batcher.running[0].sources  # as the child said with D
            assert await long == ["A"]
            return quick, left
        finally:
            await batcher.stop()

    quick, left = asyncio.run(go())
    assert quick < 0.5 and left == 1


def test_a_newcomer_held_for_company_joins_a_child_stepping_on_once_its_wait_is_over(monkeypatch):
    monkeypatch.setattr(worker_process, "STEP_ON_S", 10.0)
    batcher, _ = _batcher_of_processes(step_s=0.01)

    async def go():
        await _started(batcher)
        try:
            long = asyncio.ensure_future(batcher.submit([f"a{i}:300" for i in range(HOLD_FROM)], None, 1))
            await asyncio.sleep(0.3)  # a busy running batch: a newcomer alone waits HOLD_S for company
            began = time.monotonic()
            assert await batcher.submit(["b:1"], None, 1) == ["B"]
            waited = time.monotonic() - began
            await long
            return waited
        finally:
            await batcher.stop()

    assert HOLD_S <= asyncio.run(go()) < HOLD_S + 0.5  # not until a long source is done (3 s)


def test_a_child_that_answers_no_step_within_its_deadline_is_ended_and_says_so():
    process = WorkerProcess(Countdown, deadline_s=1.0)
    try:
        process.iterate([(1, "a:5", None)], set())
        os.kill(process.process.pid, signal.SIGSTOP)  # stopped: it will never answer
        began = time.monotonic()
        with pytest.raises(WorkerGoneError, match=r"answered no step within 1 s and was ended"):
            process.iterate([], set())
        assert time.monotonic() - began < 5 and not process.process.is_alive()
    finally:
        process.close()


def _stopped_worker_test(deadline_s: float, stall_after: float):
    """Two worker processes, one of them stopped (SIGSTOP) while it holds a request; returns what the
    batcher said of it."""
    batcher, made = _batcher_of_processes(deadline_s, max_batch_tokens=1, workers=2)

    async def go():
        await _started(batcher)
        seen = {}
        try:
            stuck = asyncio.ensure_future(batcher.submit(["a:100000000"], None, 1))
            await asyncio.sleep(0.3)
            os.kill(made[0].process.pid, signal.SIGSTOP)
            began = time.monotonic()
            other = [await batcher.submit([f"b{i}:20"], None, 1) for i in range(20)]  # the second worker
            seen["others answered"] = other == [[f"B{i}"] for i in range(20)]
            while time.monotonic() - began < stall_after:
                await asyncio.sleep(0.05)
            seen["stalled for"] = batcher.stalled_for()
            if deadline_s < stall_after * 3:
                seen["stuck"] = await asyncio.gather(stuck, return_exceptions=True)
        finally:
            began = time.monotonic()
            await batcher.stop()
            seen["stopped in"] = time.monotonic() - began
        seen.setdefault("stuck", [stuck.cancelled()])
        return seen

    try:
        return asyncio.run(go())
    finally:
        for process in made:
            process.end()


def test_one_hung_worker_shows_in_the_stall_clock_and_its_requests_are_told_after_the_deadline():
    seen = _stopped_worker_test(deadline_s=3.0, stall_after=1.5)
    assert seen["others answered"]  # the other worker went on meanwhile
    assert seen["stalled for"] > 1.4  # ... which did not hide the stopped one from /health
    (error,) = seen["stuck"]
    assert isinstance(error, WorkerGoneError) and "answered no step within 3 s" in str(error)


def test_a_hung_worker_does_not_keep_the_batcher_from_stopping():
    seen = _stopped_worker_test(deadline_s=300.0, stall_after=0.5)
    assert seen["stopped in"] < 10  # the stopped child was ended before its thread was joined
    assert seen["stuck"] == [True]  # its request was dropped (nobody waits at a stop past the grace)


def test_a_child_killed_while_it_held_nothing_is_replaced_without_failing_a_request():
    batcher, made = _batcher_of_processes()

    async def go():
        await _started(batcher)
        try:
            assert await batcher.submit(["a:2"], None, 1) == ["A"]
            os.kill(made[0].process.pid, signal.SIGKILL)  # idle: nothing of anyone's is lost
            made[0].process.join(timeout=10)
            assert await batcher.submit(["b:2"], None, 1) == ["B"]
            assert len(made) == 2 and batcher.broken is None
        finally:
            await batcher.stop()

    asyncio.run(go())


def test_a_child_ignores_sigint_and_sigterm(worker):
    worker.started()
    for number in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C reaches every process of the terminal's group
        os.kill(worker.process.pid, number)
    time.sleep(0.5)
    assert worker.iterate([(1, "a:1", None)], set()) == [(1, "A")]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_what_a_child_is_given_is_the_checkpoints_weights_whatever_the_precision_served(run, precision):
    from safetensors.torch import load

    from attnkit.loading import build_for_tokenizer, load_for_inference
    from attnkit.models import load_weights
    from attnkit.serve.served import weights_bytes
    from attnkit.serve.translator import ServedTranslator

    served = ServedTranslator.load(run, [f"decode.precision={precision}"])
    made = build_for_tokenizer(served.config, served.tokenizer)
    assert load_weights(made, load(weights_bytes(served.model))) == ([], [])  # tied tensors tied again
    stored = load_for_inference(run, pack=False)[0].state_dict()  # float32, as trained and saved
    assert made.state_dict().keys() == stored.keys()
    assert all(made.state_dict()[name].equal(tensor) for name, tensor in stored.items())


def test_a_child_makes_the_model_from_the_servers_memory_not_from_its_folder(run, tmp_path):
    import shutil

    from attnkit.checkpoint.folder import resolve_checkpoint
    from attnkit.data.synthetic import dates
    from attnkit.decode.search import BeamSettings
    from attnkit.serve.served import MadeAgain
    from attnkit.serve.translator import ServedTranslator

    folder = tmp_path / "rotated"
    shutil.copytree(resolve_checkpoint(run), folder)
    served = ServedTranslator.load(folder, ["decode.precision=fp32"])
    shutil.rmtree(folder)  # rotated away by a run still training, or its volume unmounted
    texts = dates(6, seed=5).src
    joining = [(i, text, BeamSettings(4, 2)) for i, text in enumerate(texts)]
    here = served.running_batch()
    process = WorkerProcess(MadeAgain(served))
    try:
        expected, found = {}, {}
        while len(expected) < len(texts):
            expected.update(here.iterate(joining if not expected and not here.sources else [], set()))
        while len(found) < len(texts):
            found.update(process.iterate(joining if not found and not process.sources else [], set()))
        assert found == expected
    finally:
        process.close()


@pytest.mark.parametrize("drafts", ["shallow", "another checkpoint"])
def test_a_child_makes_a_decoders_draft_again_from_the_servers_memory(decoder, tmp_path, drafts):
    """A decoder served with a draft (``decode.speculative``: its draft decoder, or another checkpoint's
    model, whose folder is gone by then): what a worker process is given makes the draft again, of the
    same kind and with the same weights (the model's ``draft.*``), before the model's weights load."""
    import pickle
    import shutil

    from attnkit.checkpoint.draft_file import write_draft
    from attnkit.checkpoint.folder import resolve_checkpoint
    from attnkit.loading import load_for_inference
    from attnkit.models.draft import draft_for
    from attnkit.serve.decoder import ServedDecoder
    from attnkit.serve.served import MadeAgain

    folder = Path(shutil.copytree(resolve_checkpoint(decoder), tmp_path / "model"))
    if drafts == "shallow":
        model = load_for_inference(folder, pack=False)[0]
        torch.manual_seed(0)
        draft = draft_for(model)
        for weight in draft.parameters():  # not the model's first layer: weights of its own
            weight.data.normal_()
        write_draft(folder, draft, {"made by": "this test"})
        speculative = "shallow"
    else:
        speculative = str(shutil.copytree(folder, tmp_path / "draft"))
    served = ServedDecoder.load(folder, [f"decode.speculative={speculative}"])
    if drafts == "another checkpoint":
        shutil.rmtree(speculative)
    made = pickle.loads(pickle.dumps(MadeAgain(served, "running_batch")))().model  # as a child calls it
    assert type(made.draft) is type(served.model.draft)
    given, found = served.model.draft.state_dict(), made.draft.state_dict()
    assert given.keys() == found.keys() and all(found[name].equal(given[name]) for name in given)


def test_worker_processes_do_not_grow_with_the_cores_unless_asked(run):
    from attnkit.serve.served import MAX_WORKER_PROCESSES
    from attnkit.serve.translator import ServedTranslator

    before = torch.get_num_threads()
    torch.set_num_threads(16)
    try:
        assert ServedTranslator.load(run, []).worker_processes() == MAX_WORKER_PROCESSES == 4
        assert ServedTranslator.load(run, ["decode.streams=6"]).worker_processes() == 6  # asked for: given
        assert ServedTranslator.load(run, ["decode.streams=0"]).streams == 16  # threads: one per thread still
    finally:
        torch.set_num_threads(before)
