"""attnkit serve --batching continuous through a real server process: concurrent requests with different
beams and n-best lists, joining a running batch at any step, get exactly the CLI's outputs; the
metrics show the running batch; the attention explorer still runs between steps; SIGTERM finishes.
Worker processes: a killed one fails only its running requests, one killed while idle fails none, a
new one is made from the server's memory (its checkpoint folder may be gone), a hung one is noticed
by /health and ended at its deadline and never keeps the server from stopping, and Ctrl-C in the
terminal finishes what runs."""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the server tests need httpx: pip install 'attnkit[test]'")
pytest.importorskip("fastapi", reason="attnkit serve needs FastAPI: pip install 'attnkit[serve]'")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from attnkit.cpu.allocator import choose  # noqa: E402
from attnkit.data.synthetic import dates  # noqa: E402
from tests.serve.servers import Server, generated, worker_processes  # noqa: E402

pytestmark = pytest.mark.slow  # a trained model and a server process

SENTENCES = dates(32, seed=11).src


def _cli(run, tmp_path, beam, n_best=0, overrides=()):
    source = tmp_path / "dates.txt"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    command = ["translate", "--ckpt", str(run), "-i", str(source), "--beam", str(beam), *overrides]
    if not any(override.startswith("decode.steps=") for override in overrides):
        command.append("decode.steps=eager")  # as the test's servers (servers.Server)
    if n_best:
        command += ["--n-best", str(n_best)]
    result = subprocess.run([sys.executable, "-m", "attnkit", *command], capture_output=True, text=True,
                            encoding="utf-8", check=True)  # fmt: skip
    return result.stdout.splitlines()


def _samples(server):
    text = httpx.get(f"{server.url}/metrics").text
    samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    return {sample.name: sample.value for sample in samples}


# every answer is the CLI's for that sentence alone, in every precision and step kind (docs/invariance.md)
@pytest.mark.parametrize(
    ("overrides", "workers"),
    [
        ((), "threads"),
        (("decode.precision=int8",), "processes"),
        (("decode.steps=compiled",), "processes"),
    ],
    ids=["defaults, model's steps on threads", "int8 in processes", "compiled steps in processes"],
)
def test_32_clients_joining_a_running_batch_get_the_cli_outputs(run, tmp_path, overrides, workers):
    expected = {1: _cli(run, tmp_path, 1, 0, overrides), 4: _cli(run, tmp_path, 4, 0, overrides)}
    n_best = [line.split(" ||| ") for line in _cli(run, tmp_path, 4, 2, overrides)]  # LINE ||| TEXT ||| SCORE
    served = Server(run, "--batching", "continuous", "--workers", workers, "decode.streams=2", *overrides)
    worker_pids = worker_processes(served.process.pid)
    try:
        assert len(worker_pids) == (2 if workers == "processes" else 0)  # one per worker, its model loaded
        library, _ = choose("auto")  # what --allocator auto gives them, where this machine has one
        for pid in worker_pids if library else ():
            assert Path(library).name in Path(f"/proc/{pid}/maps").read_text(encoding="utf-8")

        def ask(i):
            beam, best = (1, 1) if i % 3 == 0 else (4, 2 if i % 3 == 2 else 1)
            response = served.post([{"src": SENTENCES[i], "beam_size": beam, "n_best": best}])
            assert response.status_code == 200, f"{response.text}\n{served.output()[-6000:]}"  # (its log)
            return i, beam, best, response.json()[0]

        with ThreadPoolExecutor(32) as clients:
            answers = list(clients.map(ask, range(32)))
        for i, beam, best, results in answers:
            assert [r["src"] for r in results] == [SENTENCES[i]] * best
            assert results[0]["tgt"] == expected[beam][i]
            if best == 2:
                assert [r["tgt"] for r in results] == [text for _, text, _ in n_best[2 * i : 2 * i + 2]]
                scores = [float(score) for _, _, score in n_best[2 * i : 2 * i + 2]]
                assert [r["pred_score"] for r in results] == pytest.approx(scores, abs=1e-4)
                assert results[0]["pred_score"] >= results[1]["pred_score"]
        samples = _samples(served)
        assert samples["attnkit_first_token_seconds_count"] == 32
        assert samples["attnkit_steps_total"] >= 10  # every step counted (the outputs are ~10 tokens)
        assert samples["attnkit_running_rows"] == 0 and samples["attnkit_running_sources"] == 0  # all done
        page = httpx.get(f"{served.url}/explore", params={"text": SENTENCES[0]}, timeout=60)
        assert page.status_code == 200 and "attention-data" in page.text  # run between steps
        assert served.post([{"src": SENTENCES[1], "beam_size": 4}]).json()[0][0]["tgt"] == expected[4][1]
    finally:
        code, output = served.stop()
    assert code == 0, output
    for worker in worker_pids:  # the worker processes ended with the server (or wait, zombies, to be reaped)
        stat = Path(f"/proc/{worker}/stat")
        assert not stat.exists() or stat.read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0] == "Z"


def test_a_killed_worker_process_fails_its_requests_alone_and_a_new_one_takes_over(run):
    """A worker's process dies (killed, out of memory): the requests in its running batch get
    a 500 naming it, at once; the server stays ready, and the next requests are answered by a new one."""
    served = Server(run, "--batching", "continuous", "decode.streams=1", "decode.precision=fp32")
    try:
        (worker,) = worker_processes(served.process.pid)
        expected = served.post([{"src": SENTENCES[0]}]).json()[0][0]["tgt"]
        killed = threading.Event()

        def client(i):  # requests one after another until the worker process has been killed
            answers = []
            while not killed.is_set():
                answers.append(served.post([{"src": s} for s in SENTENCES[i : i + 8]]))
            return answers

        with ThreadPoolExecutor(8) as clients:
            running = [clients.submit(client, i) for i in range(8)]
            deadline = time.monotonic() + 30
            while _samples(served)["attnkit_running_sources"] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(worker, signal.SIGKILL)
            killed.set()
            answers = [answer for done in running for answer in done.result()]
        failed = [a for a in answers if a.status_code != 200]
        assert failed, "no request was running when the worker process was killed"
        for answer in failed:
            assert answer.status_code == 500
            assert "the worker process is gone (ended by SIGKILL)" in answer.text
        assert httpx.get(f"{served.url}/health").json() == {"status": "ready", "steps": "eager"}
        assert served.post([{"src": SENTENCES[0]}]).json()[0][0]["tgt"] == expected  # a new worker process
        (new,) = worker_processes(served.process.pid)
        assert new != worker
    finally:
        code, output = served.stop()
    assert code == 0, output


def test_a_worker_process_killed_while_idle_is_made_again_from_memory_though_its_checkpoint_is_gone(
    run, tmp_path
):
    import shutil

    from attnkit.checkpoint.folder import resolve_checkpoint

    folder = tmp_path / "served"
    shutil.copytree(resolve_checkpoint(run), folder)
    served = Server(folder, "--batching", "continuous", "decode.streams=1", "decode.precision=fp32")
    try:
        expected = served.post([{"src": s} for s in SENTENCES[:4]]).json()
        shutil.rmtree(folder)  # rotated away by a run still training, or its volume unmounted
        (worker,) = worker_processes(served.process.pid)
        os.kill(worker, signal.SIGKILL)  # while it held nothing
        time.sleep(0.5)
        answer = served.post([{"src": s} for s in SENTENCES[:4]])
        assert answer.status_code == 200 and answer.json() == expected, answer.text  # no request failed
        assert httpx.get(f"{served.url}/health").json() == {"status": "ready", "steps": "eager"}
        (new,) = worker_processes(served.process.pid)
        assert new != worker
    finally:
        code, output = served.stop()
    assert code == 0, output


def test_a_hung_worker_process_is_noticed_by_health_ended_at_its_deadline_and_replaced(run):
    served = Server(run, "--batching", "continuous", "decode.streams=1", "decode.precision=fp32",
                    "--stall-after", "2")  # fmt: skip
    try:
        expected = served.post([{"src": SENTENCES[0]}]).json()
        (worker,) = worker_processes(served.process.pid)
        os.kill(worker, signal.SIGSTOP)  # stopped: it will never answer
        with ThreadPoolExecutor(1) as client:
            waiting = client.submit(served.post, [{"src": SENTENCES[0]}])
            began = time.monotonic()
            while (health := httpx.get(f"{served.url}/health")).status_code == 200:
                assert time.monotonic() - began < 3.5, "the hung worker process did not show in /health"
                time.sleep(0.1)
            assert health.json()["status"] == "stalled" and time.monotonic() - began > 1.5  # past 2 s
            answer = waiting.result(timeout=30)
        # twice --stall-after: ended, its request told so
        assert answer.status_code == 500 and "answered no step within 4 s and was ended" in answer.text
        assert served.post([{"src": SENTENCES[0]}]).json() == expected  # a new worker process
        assert httpx.get(f"{served.url}/health").json() == {"status": "ready", "steps": "eager"}
    finally:
        code, output = served.stop()
    assert code == 0, output


def test_sigterm_ends_a_server_whose_worker_process_hangs_within_its_grace(run):
    served = Server(
        run, "--batching", "continuous", "decode.streams=1", "decode.precision=fp32", "--grace", "1"
    )
    (worker,) = worker_processes(served.process.pid)
    os.kill(worker, signal.SIGSTOP)
    with ThreadPoolExecutor(1) as client:
        waiting = client.submit(served.post, [{"src": SENTENCES[0]}])
        time.sleep(1)
        began = time.monotonic()
        served.process.send_signal(signal.SIGTERM)
        code = served.process.wait(timeout=60)
        answer = waiting.result(timeout=10)
    assert code == 0 and time.monotonic() - began < 15, served.output()
    assert answer.status_code == 503 and answer.json()["kind"] == "shutting_down"


def test_ctrl_c_in_the_terminal_finishes_the_requests_running_and_no_worker_process_dies_mid_step(
    run, tmp_path
):
    """Ctrl-C signals every process of the terminal's foreground group: the worker processes ignore it,
    and the server, as for SIGTERM, answers what it accepted and exits 0."""
    expected = _cli(run, tmp_path, 4, 0, ("decode.precision=fp32",))
    served = Server(
        run, "--batching", "continuous", "decode.streams=2", "decode.precision=fp32", own_group=True
    )
    sent = threading.Event()

    def client(i):  # request after request until Ctrl-C; those the server no longer accepts fail to connect
        answers = []
        while not sent.is_set():
            try:
                answers.append(served.post([{"src": s, "beam_size": 4} for s in SENTENCES[i : i + 8]]))
            except httpx.TransportError:
                break
        return i, answers

    with ThreadPoolExecutor(8) as clients:
        running = [clients.submit(client, i) for i in range(8)]
        deadline = time.monotonic() + 30
        while _samples(served)["attnkit_running_sources"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(served.process.pid, signal.SIGINT)
        sent.set()
        answered = [done.result() for done in running]
    code = served.process.wait(timeout=60)
    output = served.output()
    assert code == 0 and "Traceback" not in output and "KeyboardInterrupt" not in output, output
    for i, answers in answered:
        for answer in answers:
            assert answer.status_code == 200, answer.text
            assert [r["tgt"] for r in answer.json()[0]] == expected[i : i + 8]


def test_continuous_batching_is_refused_in_one_line_where_there_is_no_running_batch(run, tmp_path):
    command = [sys.executable, "-m", "attnkit", "serve", "--ckpt", str(run), "--batching", "always"]
    bad = subprocess.run(command, capture_output=True, text=True, encoding="utf-8")
    assert bad.returncode != 0 and "--batching always: choose one of auto, continuous, batches" in bad.stderr


def test_32_clients_sampling_from_a_running_batch_get_what_attnkit_generate_gives(decoder, tmp_path):
    """32 concurrent prompts of several lengths (every other one streamed), each with its own seed, join
    a running batch as they come, in the default precision: each continuation is what ``attnkit
    generate`` gives that prompt with that seed alone."""
    import json

    prompts = ["the cat", "the dog sat on", "t", "the fox sat on the b"] * 8
    decode = ["decode.max_new_tokens=16", "decode.top_k=4", "decode.temperature=1.0"]
    expected = generated(decoder, prompts, decode, tmp_path)  # prompt i: seed 1337 + i
    assert len(set(expected)) > 8  # the seeds matter: the same prompts continue differently
    served = Server(decoder, "--batching", "continuous", "decode.streams=2", *decode)
    try:

        def ask(i):
            body = {"inputs": prompts[i], "parameters": {"seed": 1337 + i}}
            if i % 2 == 0:
                answer = httpx.post(f"{served.url}/generate", json=body, timeout=60)
                assert answer.status_code == 200, answer.text
                return answer.json()["generated_text"]
            stream = httpx.post(f"{served.url}/generate_stream", json=body, timeout=60)
            events = [json.loads(line.removeprefix("data: ")) for line in stream.text.split("\n\n") if line]
            assert "".join(event["token"]["text"] for event in events) == events[-1]["generated_text"]
            return events[-1]["generated_text"]

        with ThreadPoolExecutor(32) as clients:
            assert list(clients.map(ask, range(32))) == expected
        assert _samples(served)["attnkit_first_token_seconds_count"] == 32
    finally:
        code, output = served.stop()
    assert code == 0, output


def _with_drafts(run: Path, tmp_path: Path, drafts: str) -> tuple[Path, str]:
    """What serves ``run`` with ``drafts`` and its ``decode.speculative``: the run itself with drafts
    from the source; a copy of it whose draft decoder is a copy of the model's first layer
    (undistilled); the run with its twin as another checkpoint's model (whose guesses are all right)."""
    from attnkit.checkpoint.draft_file import write_draft
    from attnkit.checkpoint.folder import resolve_checkpoint
    from attnkit.loading import load_for_inference
    from attnkit.models.draft import draft_for

    if drafts == "source":
        return run, "source"
    if drafts == "shallow":
        copied = Path(shutil.copytree(resolve_checkpoint(run), tmp_path / "with_draft"))
        write_draft(copied, draft_for(load_for_inference(copied, pack=False)[0]), {"made by": "this test"})
        return copied, "shallow"
    return run, str(shutil.copytree(resolve_checkpoint(run), tmp_path / "twin"))


@pytest.mark.parametrize("drafts", ["source", "shallow", "another checkpoint"])
def test_a_lone_client_of_a_decoder_served_with_drafts_gets_attnkit_generates_texts(
    decoder, tmp_path, drafts
):
    """``decode.speculative``: greedy requests one at a time (each continued alone in a worker process's
    running batch, checking drafts copied from its prompt and text so far, or guessed by the
    checkpoint's draft decoder, or by another checkpoint's model: both made again in the worker
    processes from what the server holds), streamed or cut at a stop string too, and sampled ones
    (which check none): each answer is plain ``attnkit generate``'s text for its prompt and seed. The
    server loads the drafts without a word."""
    import json

    decoder, speculative = _with_drafts(decoder, tmp_path, drafts)
    prompts = ["the cat", "the dog sat on", "t", "the fox sat on the b"]
    greedy = generated(decoder, prompts, ["decode.max_new_tokens=40", "decode.temperature=0"], tmp_path)
    sampled = generated(decoder, prompts, ["decode.max_new_tokens=40", "decode.temperature=1.0",
                                           "decode.top_k=4"], tmp_path)  # fmt: skip
    served = Server(decoder, "--batching", "continuous", "--workers", "processes", "decode.temperature=0",
                    "decode.max_new_tokens=40", f"decode.speculative={speculative}")  # fmt: skip
    if drafts == "another checkpoint":
        shutil.rmtree(speculative)  # the workers make the draft again from what the server holds
    try:
        for i, prompt in enumerate(prompts):
            answer = httpx.post(f"{served.url}/generate", json={"inputs": prompt}, timeout=60)
            assert answer.json()["generated_text"] == greedy[i], prompt
            body = {"inputs": prompt, "parameters": {"stop": ["on"]}}
            stream = httpx.post(f"{served.url}/generate_stream", json=body, timeout=60)
            events = [json.loads(line.removeprefix("data: ")) for line in stream.text.split("\n\n") if line]
            assert "".join(event["token"]["text"] for event in events) == greedy[i].split("on")[0], prompt
            body = {"inputs": prompt, "parameters": {"temperature": 1.0, "top_k": 4, "seed": 1337 + i}}
            answer = httpx.post(f"{served.url}/generate", json=body, timeout=60)
            assert answer.json()["generated_text"] == sampled[i], prompt
    finally:
        code, output = served.stop()
    assert code == 0, output
    assert "speculative" not in output, output


@pytest.mark.parametrize("drafts", ["source", "shallow", "another checkpoint"])
def test_a_lone_client_of_a_translator_served_with_drafts_gets_attnkit_translates_answers(
    run, tmp_path, drafts
):
    """``decode.speculative`` for a translator: greedy requests one at a time (each searched alone in a
    worker process's running batch, checking drafts copied from its source, or guessed by the
    checkpoint's draft decoder, or by another checkpoint's model, made again in the worker processes
    from what the server holds), and a beam search beside them (which checks none): each answer is
    ``attnkit translate``'s translation and score for its sentence alone. The server loads the drafts
    without a word."""
    checkpoint, speculative = _with_drafts(run, tmp_path, drafts)
    greedy = [line.split(" ||| ") for line in _cli(checkpoint, tmp_path, 1, 1)]  # LINE ||| TEXT ||| SCORE
    beam = _cli(checkpoint, tmp_path, 4)
    served = Server(checkpoint, "--batching", "continuous", "--workers", "processes",
                    f"decode.speculative={speculative}")  # fmt: skip
    if drafts == "another checkpoint":
        shutil.rmtree(speculative)  # the workers make the draft again from what the server holds
    try:
        for i, sentence in enumerate(SENTENCES[:6]):
            (answer,) = served.post([{"src": sentence, "beam_size": 1}]).json()[0]
            assert answer["tgt"] == greedy[i][1], sentence
            assert answer["pred_score"] == pytest.approx(float(greedy[i][2]), abs=1e-4), sentence
        (answer,) = served.post([{"src": SENTENCES[7], "beam_size": 4}]).json()[0]
        assert answer["tgt"] == beam[7]
    finally:
        code, output = served.stop()
    assert code == 0, output
    assert "speculative" not in output, output


@pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None,
    reason="compiling the steps needs a C++ compiler (apt-get install g++)",
)
def test_with_no_options_the_server_answers_at_once_and_takes_the_compiled_steps_once_built(
    run, tmp_path, monkeypatch
):
    """``decode.steps=auto``, the default, with no compiled steps in the cache: the server is ready at once
    and answers with the model's own steps while a process of its own builds the compiled ones, the run's
    beam's and greedy search's (``/health``: ``compiling``), then says ``compiled`` and logs it, and
    answers with them; every answer is what ``attnkit translate`` gives alone with the steps there were
    (the CLI takes the built steps from the cache as the server does)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing built for this model yet
    served = Server(run, "--batching", "continuous", "decode.streams=1", steps=None)
    try:
        assert httpx.get(f"{served.url}/health").json() == {"status": "ready", "steps": "compiling"}
        eager = _cli(run, tmp_path, 4, overrides=["decode.steps=eager"])
        assert served.post([{"src": s} for s in SENTENCES[:4]]).json()[0][0]["tgt"] == eager[0]
        deadline = time.monotonic() + 300
        while httpx.get(f"{served.url}/health").json()["steps"] == "compiling":
            assert time.monotonic() < deadline, served.output()
            time.sleep(1)
        assert httpx.get(f"{served.url}/health").json() == {"status": "ready", "steps": "compiled"}
        assert "the compiled decoding steps are built" in served.output()
        # the steps the server built (one stream: loops over its threads) from the cache, built no more;
        # and those the default takes (a stream per thread) where it may not build: the same
        compiled = _cli(run, tmp_path, 4, overrides=["decode.steps=compiled", "decode.streams=1"])
        assert _cli(run, tmp_path, 4, overrides=["decode.steps=auto"]) == compiled
        # the first step, beam 4's and greedy search's (a request may ask for a beam of one)
        assert len(list((tmp_path / "cache").rglob("*.pt2"))) == 3
        greedy = _cli(run, tmp_path, 1, overrides=["decode.steps=compiled", "decode.streams=1"])
        assert len(list((tmp_path / "cache").rglob("*.pt2"))) == 3  # (built by the server: none more)
        time.sleep(1.5)  # the running batches look every second
        answers = served.post([{"src": s} for s in SENTENCES]).json()[0]  # (OpenNMT's: n-best lists first)
        assert [answer["tgt"] for answer in answers] == compiled
        answers = served.post([{"src": s, "beam_size": 1} for s in SENTENCES]).json()[0]
        assert [answer["tgt"] for answer in answers] == greedy
    finally:
        code, output = served.stop()
    assert code == 0, output
    assert "building the compiled decoding steps in the background" in output
