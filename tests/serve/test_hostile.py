"""attnkit serve against hostile and careless clients, through real server processes: no request hangs
the server, none grows it without bound, and every input gets an answer in the server's error format.

Each test reproduces one way a review took the server down or made it misbehave (explorers that
deadlocked the batcher, a 50 MB body read whole, a 1,000-character /explore, random paths in /metrics,
long stop strings, vanishing empty inputs, streams generating for nobody, a busy port), and checks
what a client gets now."""

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx", reason="the server tests need httpx: pip install 'attnkit[test]'")
pytest.importorskip("fastapi", reason="attnkit serve needs FastAPI: pip install 'attnkit[serve]'")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from attnkit.config import load_run_config  # noqa: E402
from attnkit.loading import load_for_inference  # noqa: E402
from attnkit.train.loop import Trainer  # noqa: E402
from tests.serve.servers import Server  # noqa: E402

pytestmark = pytest.mark.slow  # trained models and several server processes

DATE = "June 1, 1999"


@pytest.fixture(scope="module")
def server(run):
    """Two workers (decode.streams=2), as the default gives on two cores: the explorer's deadlock needed
    two."""
    served = Server(run, "decode.streams=2")
    yield served
    served.stop()


def _series(server, family_name):
    text = httpx.get(f"{server.url}/metrics").text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == family_name]
    return family.samples


def _errors(server):
    return {s.labels["kind"]: s.value for s in _series(server, "attnkit_errors") if s.name.endswith("_total")}


def test_explorers_amid_translations_never_deadlock_the_batcher(server):
    """Four clients translating and two exploring for 8 s, then one more translation: it used to never
    return (two explorers each held one worker and waited for the other's)."""
    until = time.monotonic() + 8
    answered = {"translate": 0, "explore": 0}

    def translating():
        while time.monotonic() < until:
            assert server.post([{"src": DATE}]).status_code == 200
            answered["translate"] += 1

    def exploring():
        while time.monotonic() < until:
            page = httpx.get(f"{server.url}/explore", params={"text": DATE}, timeout=60)
            assert page.status_code == 200
            answered["explore"] += 1

    with ThreadPoolExecutor(6) as clients:
        for done in [clients.submit(translating) for _ in range(4)] + [
            clients.submit(exploring) for _ in range(2)
        ]:
            done.result(timeout=60)
    began = time.monotonic()
    after = httpx.post(f"{server.url}/translator/translate", json=[{"src": DATE}], timeout=10)
    assert after.status_code == 200 and time.monotonic() - began < 5
    assert answered["translate"] > 10 and answered["explore"] > 2, answered
    assert httpx.get(f"{server.url}/health").json() == {"status": "ready", "steps": "eager"}


def test_a_body_over_the_limit_is_refused_at_once_and_health_stays_responsive(server):
    """5 MB (the default limit is 1 MiB): 413 within a second, announced or not by Content-Length,
    while /health answers meanwhile. A 50 MB body used to be read, parsed and tokenised whole first
    (224 s, 9.7 GB)."""
    body = json.dumps([{"src": "1 May 2001 " * 100}] * 5000).encode()
    assert len(body) > 5_000_000
    headers = {"content-type": "application/json"}
    healthy = []

    def probing():
        while len(healthy) < 10:
            began = time.monotonic()
            assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
            healthy.append(time.monotonic() - began)

    prober = threading.Thread(target=probing)
    prober.start()
    for content in (body, (body[i : i + 65536] for i in range(0, len(body), 65536))):  # sized, then chunked
        began = time.monotonic()
        refused = httpx.post(
            f"{server.url}/translator/translate", content=content, headers=headers, timeout=30
        )
        took = time.monotonic() - began
        assert refused.status_code == 413 and refused.json()["kind"] == "too_large", refused.text
        assert "--max-body-bytes 1,048,576" in refused.json()["error"] and took < 1, took
    prober.join(timeout=30)
    assert len(healthy) == 10 and max(healthy) < 1, healthy


def test_the_explorer_refuses_text_over_its_token_limit_and_keeps_its_pages_small(server):
    long = httpx.get(f"{server.url}/explore", params={"text": "May 1, 2001 " * 84}, timeout=30)  # 1,008 chars
    assert long.status_code == 413 and long.json()["kind"] == "too_long"
    assert "more than the explorer's 64 (--max-explore-tokens)" in long.json()["error"]
    at_limit = httpx.get(f"{server.url}/explore", params={"text": "May 1, 2001 " * 5 + "May"}, timeout=30)
    assert at_limit.status_code == 200 and len(at_limit.content) < 2_000_000, len(at_limit.content)
    target = httpx.get(f"{server.url}/explore", params={"text": DATE, "target": "1" * 65}, timeout=30)
    assert target.status_code == 413 and target.json()["error"].startswith("target: 65 tokens")


def test_random_paths_do_not_grow_the_metrics(server):
    """Requests are labelled by route; every unknown path shares one label (it used to be one series per
    path: 500 random paths grew /metrics from 8.5 KB to 764 KB)."""
    for i in range(50):
        httpx.get(f"{server.url}/nope/{i}")
    before = len(list(text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)))
    series = len(_series(server, "attnkit_requests"))
    for i in range(200):
        missing = httpx.get(f"{server.url}/random-{i}/path")
        assert missing.status_code == 404 and missing.json() == {
            "error": f"/random-{i}/path: Not Found",
            "kind": "not_found",
        }
    after = len(list(text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)))
    assert after == before and len(_series(server, "attnkit_requests")) == series  # no series were added
    endpoints = {s.labels["endpoint"] for s in _series(server, "attnkit_requests")}
    assert "unmatched" in endpoints and not any("random" in e or "nope" in e for e in endpoints)


def test_every_input_gets_one_result_in_order_empty_and_blank_ones_too(server):
    sources = ["March 3, 2001", "", "  ", "June 5, 1999"]
    answer = server.post([{"src": s} for s in sources])
    assert answer.status_code == 200
    (results,) = answer.json()
    assert [r["src"] for r in results] == sources
    assert results[1]["tgt"] == results[2]["tgt"] == "" and results[0]["tgt"] and results[3]["tgt"]
    two_best = server.post([{"src": s, "beam_size": 4, "n_best": 2} for s in sources])
    (results,) = two_best.json()
    assert [r["src"] for r in results] == [s for s in sources for _ in range(2)]


def test_bodies_that_are_not_text_or_json_get_the_error_format_naming_the_problem(server):
    url, headers = f"{server.url}/translator/translate", {"content-type": "application/json"}
    surrogate = httpx.post(url, content=b'[{"src": "\\ud800"}]', headers=headers)
    assert surrogate.status_code == 422 and surrogate.json()["kind"] == "invalid_request"
    assert surrogate.json()["error"].startswith("0.src: ") and "surrogate" in surrogate.json()["error"]
    for body in ('[{"src": "é"}]'.encode("latin-1"), b"[" * 50_000 + b"]" * 50_000):
        refused = httpx.post(url, content=body, headers=headers)
        assert refused.status_code == 400 and refused.json()["kind"] == "malformed_json", refused.text
    wrong_method = httpx.get(url)
    assert wrong_method.status_code == 405 and wrong_method.json()["kind"] == "method_not_allowed"
    assert server.post([{"src": DATE}]).status_code == 200


def test_info_shows_no_paths_of_the_servers_machine_and_the_docs_load_nothing_from_a_cdn(run, server):
    info = httpx.get(f"{server.url}/info")
    assert info.status_code == 200 and str(run.parent) not in info.text
    body = info.json()
    assert body["checkpoint"] == "step-0000120" and body["config"]["decode"]["beam_size"] == 4
    # the precision it serves in, as the loader resolved auto on this machine: bf16 where the CPU has
    # the units and the model maps large enough for them, fp32 otherwise (this toy model's)
    assert body["config"]["decode"]["precision"] == load_for_inference(run)[2].decode.precision
    assert "train" not in body["config"] and "dir" not in body["config"]["data"]
    assert httpx.get(f"{server.url}/docs").status_code == 404
    assert httpx.get(f"{server.url}/openapi.json").json()["info"]["title"] == "attnkit"


def test_a_server_on_loopback_answers_only_to_loopback_host_names(server):
    """A web page on another site cannot reach a server on 127.0.0.1 by renaming itself (DNS rebinding):
    its requests name its own host."""
    port = server.url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "[::1]"):
        assert httpx.get(f"{server.url}/health", headers={"host": host}).status_code == 200
    rebound = httpx.post(f"{server.url}/translator/translate", json=[{"src": DATE}],
                         headers={"host": f"evil.example:{port}"})  # fmt: skip
    assert rebound.status_code == 400 and rebound.json()["kind"] == "wrong_host"


def test_the_api_key_accepts_any_case_of_the_scheme_and_guards_unknown_paths_too(run):
    guarded = Server(
        run, "--api-key", "s3cret", "--workers", "threads"
    )  # the guard, wherever the engine runs
    try:
        for scheme in ("Bearer", "bearer", "BEARER"):
            answer = guarded.post([{"src": DATE}], authorization=f"{scheme} s3cret")
            assert answer.status_code == 200, (scheme, answer.text)
        assert guarded.post([{"src": DATE}], authorization="Bearer s3cre").status_code == 401
        assert guarded.post([{"src": DATE}], authorization="Basic s3cret").status_code == 401
        for i in range(20):
            assert httpx.get(f"{guarded.url}/unknown-{i}").status_code == 401
        metrics = httpx.get(f"{guarded.url}/metrics", headers={"authorization": "Bearer s3cret"}).text
        assert "unknown-" not in metrics
    finally:
        guarded.stop()


def test_health_says_stalled_while_requests_wait_with_no_batch_moving(run):
    """A batch that waits 4 s for company (--max-wait-ms 4000) stands for a server that has stopped making
    progress: past --stall-after 1, /health is 503 "stalled" (an orchestrator restarts it), then ready
    again once the batch has run."""
    slow = Server(run, "--batching", "batches", "--max-wait-ms", "4000", "--stall-after", "1")
    try:
        with ThreadPoolExecutor(1) as client:
            waiting = client.submit(slow.post, [{"src": DATE}])
            time.sleep(2)
            stalled = httpx.get(f"{slow.url}/health")
            assert stalled.status_code == 503 and stalled.json()["status"] == "stalled", stalled.text
            assert waiting.result().status_code == 200
        assert httpx.get(f"{slow.url}/health").json() == {"status": "ready", "steps": "eager"}
    finally:
        slow.stop()


def _serve_fails(*arguments):
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "attnkit", "serve", *map(str, arguments)],
                            capture_output=True, text=True, encoding="utf-8", timeout=60)  # fmt: skip
    return result, time.monotonic() - began


def test_an_address_that_cannot_be_served_is_one_line_naming_it_before_the_model_loads(run, server):
    port = server.url.rsplit(":", 1)[1]  # busy: the module's server listens there
    for arguments, said in (
        (["--port", port], f"cannot listen on 127.0.0.1:{port}: Address already in use"),
        (["--port", "99999"], "--port 99999: a port is a number from 0 to 65535"),
        (["--host", "no-such-host.invalid"], "--host no-such-host.invalid: not an address to listen on"),
    ):
        result, took = _serve_fails("--ckpt", run, *arguments)
        assert result.returncode == 2, (arguments, result.returncode, result.stderr)
        assert result.stderr.count("\n") == 1 and said in result.stderr, result.stderr
        assert took < 30


def test_every_option_and_decode_setting_is_checked_before_the_server_starts(run):
    for arguments, said in (
        (["decode.beam_size=0"], "decode.beam_size must be >= 1; got 0"),
        (["--grace", "-5"], "--grace must be at least 0"),
        (["--max-body-bytes", "0"], "--max-body-bytes must be at least 1"),
        (["--workers", "fibres"], "--workers fibres: choose one of processes, threads"),
        (
            ["--allocator", "tcmallocc"],
            "--allocator tcmallocc: choose one of auto, tcmalloc, jemalloc, system",
        ),
    ):
        result, _ = _serve_fails("--ckpt", run, "--port", "0", *arguments)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, (arguments, result.stderr)
        assert said in result.stderr, result.stderr


@pytest.fixture(scope="module")
def long_decoder(tmp_path_factory):
    """A character GPT with 1,024 positions: long enough for a stream that its client leaves early."""
    folder = tmp_path_factory.mktemp("long_decoder")
    lines = [f"the {a} sat on the {p}.\n" for a in ("cat", "dog", "hen") for p in ("mat", "log", "den")] * 30
    (folder / "text.txt").write_text("".join(lines), encoding="utf-8")
    config = load_run_config(None, [
        "model.arch=decoder", "model.preset=tiny-decoder", "model.max_len=1024", "data.task=text",
        f"data.dir={folder}", "data.train=[text.txt]", "data.tokenizer=char", "train.max_tokens=1024",
        "train.schedule=constant", "train.lr=0.003", "train.warmup=1", "train.max_steps=20",
        "train.eval_every=20", f"data.store={folder / 'stores'}",
    ])  # fmt: skip
    Trainer(config, folder / "run", echo=lambda message: None).fit()
    return folder / "run"


def _batch_seconds(server):
    samples = {s.name: s.value for s in _series(server, "attnkit_batch_seconds")}
    return samples["attnkit_batch_seconds_count"], samples["attnkit_batch_seconds_sum"]


def _steps(server):
    """A running batch's steps so far, and whether it is running any prompt (continuous batching)."""
    samples = {s.name: s.value for s in _series(server, "attnkit_steps")}
    running = {s.name: s.value for s in _series(server, "attnkit_running_sources")}
    return samples.get("attnkit_steps_total", 0.0), running.get("attnkit_running_sources", 0.0)


@pytest.mark.parametrize("batching", ["batches", "continuous"])
def test_generation_requests_out_of_bounds_are_refused_and_a_left_stream_stops_generating(
    long_decoder, batching
):
    served = Server(long_decoder, "decode.max_new_tokens=1000", "decode.temperature=0", "decode.streams=1",
                    "--batching", batching)  # fmt: skip
    try:
        url = f"{served.url}/generate"
        for parameters, field in (
            ({"seed": 2**64}, "parameters.seed"),
            ({"temperature": 1e308}, "parameters.temperature"),
            ({"stop": ["."] * 17}, "parameters.stop"),
            ({"stop": ["x" * 400_000]}, "parameters.stop.0"),
        ):
            refused = httpx.post(url, json={"inputs": "the", "parameters": parameters}, timeout=30)
            assert refused.status_code == 422 and refused.json()["error"].startswith(f"{field}: "), (
                refused.text
            )
        listed = {"prompt": ["the", "a"], "seed": 2**63 - 1}  # prompt 1 would be seeded 2**63
        refused = httpx.post(f"{served.url}/v1/completions", json=listed, timeout=30)
        assert refused.status_code == 422 and refused.json()["error"].startswith("seed: "), refused.text

        whole = httpx.post(url, json={"inputs": "the"}, timeout=120)  # 1,000 tokens: the whole batch's time
        assert whole.status_code == 200 and len(whole.json()["generated_text"]) > 900
        if batching == "continuous":  # the left stream's row leaves the running batch at its next step
            whole_steps, _ = _steps(served)
            assert whole_steps >= 1000
            with httpx.stream(
                "POST", f"{served.url}/generate_stream", json={"inputs": "the"}, timeout=60
            ) as stream:
                next(line for line in stream.iter_lines() if line.startswith("data: "))  # then leaves
            deadline = time.monotonic() + 30
            while _steps(served)[1] or _errors(served).get("client_gone") != 1:
                assert time.monotonic() < deadline, "the left stream's row never left"
                time.sleep(0.1)
            assert _steps(served)[0] - whole_steps < 1000 / 3
            assert httpx.post(url, json={"inputs": "the"}, timeout=120).status_code == 200
            return
        count, whole_seconds = _batch_seconds(served)
        with httpx.stream(
            "POST", f"{served.url}/generate_stream", json={"inputs": "the"}, timeout=60
        ) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    break  # the first piece: the client leaves
        deadline = time.monotonic() + 30
        while _batch_seconds(served)[0] == count:
            assert time.monotonic() < deadline, "the left stream's batch never ended"
            time.sleep(0.1)
        left_seconds = _batch_seconds(served)[1] - whole_seconds
        assert left_seconds < whole_seconds / 3, (left_seconds, whole_seconds)
        assert _errors(served).get("client_gone") == 1
        assert httpx.post(url, json={"inputs": "the"}, timeout=120).status_code == 200
    finally:
        code, output = served.stop()
    assert code == 0 and "Traceback" not in output and "the server stopped" not in output, output
    assert "/generate_stream: the client disconnected" in output, output
