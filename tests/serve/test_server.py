"""attnkit serve through a real server process (uvicorn on a free port, real HTTP): concurrent requests
batched together get exactly the CLI's outputs; bad requests get clear JSON errors and leave the server
up; /metrics is Prometheus text; an API key guards every endpoint but /health; SIGTERM finishes what
was accepted and exits 0."""

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx", reason="the server tests need httpx: pip install 'attnkit[test]'")
pytest.importorskip("fastapi", reason="attnkit serve needs FastAPI: pip install 'attnkit[serve]'")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from attnkit.config import load_run_config  # noqa: E402
from attnkit.data.synthetic import dates  # noqa: E402
from attnkit.train.loop import Trainer  # noqa: E402
from tests.serve.servers import Server, generated  # noqa: E402

pytestmark = pytest.mark.slow  # a trained model and several server processes

SENTENCES = dates(32, seed=7).src  # held-out dates, as people write them


@pytest.fixture(scope="module")
def server(run):
    served = Server(run, "--batching", "batches", "--max-wait-ms", "100")
    yield served
    served.stop()


def test_no_line_per_request_in_the_log_unless_the_access_log_is_asked_for(run, server):
    assert server.post([{"src": SENTENCES[0]}]).status_code == 200
    assert '"POST /translator/translate HTTP/1.1" 200' not in server.output()
    logged = Server(run, "--batching", "batches", "--access-log")
    try:
        assert logged.post([{"src": SENTENCES[0]}]).status_code == 200
        deadline = time.monotonic() + 10  # the line is written once the response is sent
        while '"POST /translator/translate HTTP/1.1" 200' not in logged.output():
            assert time.monotonic() < deadline, logged.output()
            time.sleep(0.1)
    finally:
        logged.stop()


def _cli(run, tmp_path, beam):
    source = tmp_path / "dates.txt"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    command = ["translate", "--ckpt", str(run), "-i", str(source), "--beam", str(beam), "decode.steps=eager"]
    result = subprocess.run([sys.executable, "-m", "attnkit", *command], capture_output=True, text=True,
                            encoding="utf-8", check=True)  # fmt: skip
    return result.stdout.splitlines()


def _metric(server, name):
    text = httpx.get(f"{server.url}/metrics").text
    samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    return {sample.name: sample.value for sample in samples if sample.name.startswith(name)}


def _in_progress(server, endpoint):
    text = httpx.get(f"{server.url}/metrics").text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "attnkit_requests_in_progress"]
    return sum(sample.value for sample in family.samples if sample.labels["endpoint"] == endpoint)


def test_32_concurrent_clients_get_the_cli_outputs_greedy_and_beam_in_shared_batches(run, server, tmp_path):
    expected = {1: _cli(run, tmp_path, 1), 4: _cli(run, tmp_path, 4)}
    before = _metric(server, "attnkit_batch_requests")

    def ask(i):
        beam = 1 if i % 2 else 4
        response = server.post([{"src": SENTENCES[i], "id": 100, "beam_size": beam}])
        assert response.status_code == 200, response.text
        ((result,),) = response.json()
        return beam, i, result

    with ThreadPoolExecutor(32) as clients:
        answers = list(clients.map(ask, range(32)))
    for beam, i, result in answers:
        assert result["src"] == SENTENCES[i] and result["n_best"] == 1
        assert result["tgt"] == expected[beam][i]
        assert isinstance(result["pred_score"], float)
    after = _metric(server, "attnkit_batch_requests")
    requests = after["attnkit_batch_requests_sum"] - before.get("attnkit_batch_requests_sum", 0)
    batches = after["attnkit_batch_requests_count"] - before.get("attnkit_batch_requests_count", 0)
    assert requests == 32 and batches < 32  # requests shared batches


def test_one_request_of_several_sentences_and_n_best_lists(run, server, tmp_path):
    response = server.post([{"src": s, "beam_size": 4, "n_best": 2} for s in SENTENCES[:3]])
    assert response.status_code == 200, response.text
    (results,) = response.json()
    assert [r["src"] for r in results] == [s for s in SENTENCES[:3] for _ in range(2)]
    best = _cli(run, tmp_path, 4)[:3]
    assert [r["tgt"] for r in results[::2]] == best
    assert all(a["pred_score"] >= b["pred_score"] for a, b in zip(results[::2], results[1::2], strict=True))


def test_bad_requests_get_json_errors_naming_the_problem_and_the_server_stays_up(server):
    bad_json = httpx.post(f"{server.url}/translator/translate", content=b'[{"src": "12 May',
                          headers={"content-type": "application/json"})  # fmt: skip
    assert bad_json.status_code == 400 and bad_json.json()["kind"] == "malformed_json"
    wrong_type = server.post([{"src": 12}])
    assert wrong_type.status_code == 422 and wrong_type.json()["error"].startswith("0.src: ")
    missing = server.post([{"text": "12 May 2001"}])
    assert missing.status_code == 422 and missing.json()["error"].startswith("0.src: Field required")
    too_long = server.post([{"src": "1 " * 2000}])  # more characters than the 1,024 positions
    assert too_long.status_code == 413 and "more than the model's" in too_long.json()["error"]
    n_best = server.post([{"src": "1 May 2001", "beam_size": 2, "n_best": 3}])
    assert n_best.status_code == 422 and n_best.json()["error"].startswith("n_best: ")
    assert server.post([{"src": SENTENCES[0]}]).status_code == 200  # still serving
    text = httpx.get(f"{server.url}/metrics").text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    kinds = {
        s.labels["kind"]: s.value for s in families["attnkit_errors"].samples if s.name.endswith("_total")
    }
    assert kinds["malformed_json"] >= 1 and kinds["invalid_request"] >= 3 and kinds["too_long"] >= 1
    assert {"attnkit_requests", "attnkit_queue_length", "attnkit_request_seconds"} <= families.keys()
    info = httpx.get(f"{server.url}/info").json()
    assert info["arch"] == "encoder-decoder" and info["config"]["decode"]["beam_size"] == 4


def test_the_attention_explorer_is_served_at_explore(run, server, tmp_path):
    import json
    import re

    page = httpx.get(f"{server.url}/explore", params={"text": SENTENCES[0]}, timeout=60)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    found = re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page.text, re.S)
    data = json.loads(found.group(1))
    names = [m["name"] for m in data["maps"]]
    assert names == ["encoder self-attention", "decoder self-attention", "cross-attention"]
    assert data["output"] == _cli(run, tmp_path, 1)[0]  # the greedy translation the maps belong to
    assert 'action="/explore"' in page.text  # its text box asks this server again
    empty = httpx.get(f"{server.url}/explore")
    assert empty.status_code == 200 and "type a sentence" in empty.text


def test_an_api_key_guards_every_endpoint_but_health(run):
    guarded = Server(
        run, "--api-key", "s3cret", "--workers", "threads"
    )  # the guard, wherever the engine runs
    try:
        assert httpx.get(f"{guarded.url}/health").status_code == 200
        for path in ("/info", "/metrics"):
            assert httpx.get(f"{guarded.url}{path}").status_code == 401
        refused = guarded.post([{"src": SENTENCES[0]}], authorization="Bearer wrong")
        assert refused.status_code == 401 and refused.json()["kind"] == "unauthorized"
        assert guarded.post([{"src": SENTENCES[0]}], authorization="Bearer s3cret").status_code == 200
    finally:
        guarded.stop()


def test_a_full_queue_answers_503_with_retry_after_and_the_rest_are_served(run):
    busy = Server(run, "--batching", "batches", "--max-queue", "1", "--max-batch-tokens", "40")
    try:
        with ThreadPoolExecutor(12) as clients:
            answers = list(clients.map(lambda s: busy.post([{"src": s, "beam_size": 4}]), SENTENCES[:12]))
        codes = [answer.status_code for answer in answers]
        assert set(codes) <= {200, 503} and 503 in codes and 200 in codes, codes
        refused = answers[codes.index(503)]
        assert refused.headers["retry-after"] == "1" and refused.json()["kind"] == "queue_full"
    finally:
        busy.stop()


def test_sigterm_finishes_the_requests_it_accepted_and_exits_0(run):
    """The batch waits a second for more requests (--max-wait-ms 1000), so all eight are in flight
    (the server counts them in progress) when SIGTERM comes."""
    ending = Server(run, "--batching", "batches", "--max-wait-ms", "1000")
    with ThreadPoolExecutor(8) as clients:
        pending = [clients.submit(ending.post, [{"src": s, "beam_size": 4}]) for s in SENTENCES[:8]]
        deadline = time.monotonic() + 30
        while _in_progress(ending, "/translator/translate") < 8:
            assert time.monotonic() < deadline, "the eight requests never were in progress together"
        code, output = ending.stop()
        answers = [future.result() for future in pending]
    assert [answer.status_code for answer in answers] == [200] * 8
    assert code == 0, output


def test_a_client_that_disconnects_while_it_waits_is_dropped_before_its_batch_runs(run):
    """The batch waits 2 s for more requests; the client gives up after 0.5 s: its request is not run."""
    waiting = Server(run, "--batching", "batches", "--max-wait-ms", "2000")
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{waiting.url}/translator/translate", json=[{"src": SENTENCES[0]}], timeout=0.5)
        time.sleep(2.5)  # the batch's wait is over
        text = httpx.get(f"{waiting.url}/metrics").text
        families = {family.name: family for family in text_string_to_metric_families(text)}
        kinds = {
            s.labels["kind"]: s.value for s in families["attnkit_errors"].samples if s.name.endswith("_total")
        }
        ran = [s.value for s in families["attnkit_batch_requests"].samples if s.name.endswith("_count")]
        assert kinds == {"client_gone": 1.0} and ran == [0.0]
        assert waiting.post([{"src": SENTENCES[0]}]).status_code == 200  # and the server goes on
    finally:
        waiting.stop()


SENTIMENT = [("a good film", "pos"), ("a great story", "pos"), ("a bad film", "neg"), ("a dull story", "neg")]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    folder = tmp_path_factory.mktemp("classifier")
    for name, repeat in (("train.tsv", 40), ("dev.tsv", 2)):
        rows = [f"{sentence}\t{label}" for sentence, label in SENTIMENT * repeat]
        (folder / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    config = load_run_config(None, [
        "model.arch=encoder", "model.preset=tiny-encoder", "data.task=classify", f"data.dir={folder}",
        "data.train=[train.tsv]", "data.valid=[dev.tsv]", "data.tokenizer=word", "train.max_tokens=256",
        "train.schedule=constant", "train.lr=0.002", "train.warmup=1", "train.max_steps=30",
        "train.eval_every=30", "train.eval_metric=accuracy", f"data.store={folder / 'stores'}",
    ])  # fmt: skip
    Trainer(config, folder / "run", echo=lambda message: None).fit()
    return folder / "run"


def test_an_encoder_is_served_at_predict_with_attnkit_predicts_answers(classifier, tmp_path):
    inputs = tmp_path / "inputs.txt"
    sentences = [s for s, _ in SENTIMENT] + ["a good story", "a dull film"]
    inputs.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    command = [sys.executable, "-m", "attnkit", "predict", "--ckpt", str(classifier), "-i", str(inputs)]
    printed = subprocess.run(command, capture_output=True, text=True, encoding="utf-8", check=True)
    expected = [line.split("\t") for line in printed.stdout.splitlines()]
    served = Server(classifier, steps=None)
    try:
        url = f"{served.url}/predict"
        with ThreadPoolExecutor(len(sentences)) as clients:
            answers = list(
                clients.map(lambda s: httpx.post(url, json={"inputs": [s]}, timeout=60), sentences)
            )
        for answer, (label, probability) in zip(answers, expected, strict=True):
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"outputs": [{"label": label, "probability": float(probability)}]}
        empty = httpx.post(url, json={"inputs": []})
        assert empty.status_code == 422 and empty.json()["error"].startswith("inputs: ")
        assert served.post([{"src": "a good film"}]).status_code == 404  # an encoder does not translate
    finally:
        served.stop()


def _events(response):
    return [line.removeprefix("data: ") for line in response.text.split("\n\n") if line.startswith("data: ")]


# continuous batching: prompts join a running batch at any step (in float32: in bf16 a prompt's output
# may depend on what else is decoded with it, docs/serving.md)
@pytest.mark.parametrize(
    "batching",
    [("--batching", "batches"), ("--batching", "continuous", "decode.precision=fp32")],
    ids=["batches", "continuous"],
)
def test_a_decoder_is_served_in_tgis_and_openais_formats_with_attnkit_generates_outputs(
    decoder, tmp_path, batching
):
    import json

    options = [option for option in batching if not option.startswith("decode.")]
    prompts, decode = ["the cat", "the fox sat", "the"], ["decode.max_new_tokens=12", "decode.top_k=3"]
    decode += [option for option in batching if option.startswith("decode.")]
    expected = generated(decoder, prompts, decode, tmp_path)  # prompt i: seed 1337 + i
    assert len(expected) == 3 and not any("\ufffd" in text for text in expected)
    served = Server(decoder, *decode, *options)
    try:
        openai = httpx.post(
            f"{served.url}/v1/completions", json={"prompt": prompts, "max_tokens": 12}, timeout=60
        )
        assert openai.status_code == 200, openai.text
        body = openai.json()
        assert body["object"] == "text_completion" and [c["text"] for c in body["choices"]] == expected
        assert body["usage"]["prompt_tokens"] == sum(len(p) for p in prompts)  # characters

        def tgi(i):
            parameters = {"max_new_tokens": 12, "seed": 1337 + i}
            return httpx.post(f"{served.url}/generate", json={"inputs": prompts[i], "parameters": parameters},
                              timeout=60)  # fmt: skip

        with ThreadPoolExecutor(3) as clients:  # together: one batch, each with its own seed
            answers = list(clients.map(tgi, range(3)))
        assert [answer.json()["generated_text"] for answer in answers] == expected

        asked = {"inputs": prompts[1], "parameters": {"max_new_tokens": 12, "seed": 1338}}
        stream = httpx.post(f"{served.url}/generate_stream", json=asked, timeout=60)
        events = [json.loads(event) for event in _events(stream)]
        assert len(events) > 2 and events[-1]["generated_text"] == expected[1]
        assert "".join(event["token"]["text"] for event in events) == expected[1]

        streamed = httpx.post(f"{served.url}/v1/completions", timeout=60,
                              json={"prompt": prompts, "max_tokens": 12, "stream": True})  # fmt: skip
        events = _events(streamed)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(event)["choices"][0] for event in events[:-1]]
        for i, text in enumerate(expected):
            assert "".join(c["text"] for c in chunks if c["index"] == i) == text
            assert [c["finish_reason"] for c in chunks if c["index"] == i][-1] in ("stop", "length")

        empty = httpx.post(f"{served.url}/generate", json={"inputs": "", "parameters": {}})
        assert empty.status_code == 422 and empty.json()["error"].startswith("prompt 0: empty")
        cold = httpx.post(f"{served.url}/generate", json={"inputs": "the", "parameters": {"temperature": -1}})
        assert cold.status_code == 422 and cold.json()["error"].startswith("parameters.temperature")
    finally:
        served.stop()


def test_sigterm_past_the_grace_period_cuts_off_what_is_left_and_exits_0_within_it(run):
    """A batch that would wait 20 s for more requests (--max-wait-ms 20000) is still waiting when SIGTERM
    comes: with --grace 1 the server gives its clients a second, then answers them 503 (try again,
    elsewhere) and exits, well before the batch would have run."""
    ending = Server(run, "--batching", "batches", "--max-wait-ms", "20000", "--grace", "1")
    with ThreadPoolExecutor(2) as clients:
        pending = [clients.submit(ending.post, [{"src": s}]) for s in SENTENCES[:2]]
        deadline = time.monotonic() + 30
        while _in_progress(ending, "/translator/translate") < 2:
            assert time.monotonic() < deadline, "the two requests never were in progress together"
        began = time.monotonic()
        code, output = ending.stop()
        took = time.monotonic() - began
        cut = [future.result(timeout=30) for future in pending]
    assert code == 0, output
    assert 1 <= took < 6, (took, output)
    for answer in cut:
        assert answer.status_code == 503 and answer.json()["kind"] == "shutting_down", answer.text
        assert answer.headers["retry-after"] == "1"


def _attnkit(*arguments):
    result = subprocess.run([sys.executable, "-m", "attnkit", *map(str, arguments)], capture_output=True,
                            text=True, encoding="utf-8")  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_ctranslate2_engine_serves_an_exported_translator_with_the_clis_outputs(run, tmp_path):
    pytest.importorskip("ctranslate2", reason="--engine ctranslate2 needs CTranslate2")
    exported = tmp_path / "ct2"
    _attnkit("export", "--ckpt", run, "--to", "ctranslate2", "--out", exported)
    source = tmp_path / "dates.txt"
    source.write_text("\n".join(SENTENCES[:20]) + "\n", encoding="utf-8")
    expected = {
        beam: _attnkit(
            "translate", "--engine", "ctranslate2", "--ckpt", exported, "-i", source, "--beam", beam
        ).splitlines()
        for beam in (1, 4)
    }
    served = Server(exported, "--engine", "ctranslate2", "--max-wait-ms", "100", steps=None)
    try:

        def ask(i):
            beam = 1 if i % 2 else 4
            response = served.post([{"src": SENTENCES[i], "beam_size": beam}])
            assert response.status_code == 200, response.text
            ((result,),) = response.json()
            return result["tgt"] == expected[beam][i]

        with ThreadPoolExecutor(20) as clients:  # 20 at once: batched together, as the CLI's file
            assert all(clients.map(ask, range(20)))
        assert _metric(served, "attnkit_batch_requests_count")["attnkit_batch_requests_count"] < 20
        info = httpx.get(f"{served.url}/info").json()
        assert info["engine"] == "ctranslate2" and info["arch"] == "encoder-decoder"
        explore = httpx.get(f"{served.url}/explore", params={"text": SENTENCES[0]})
        assert explore.status_code == 404 and explore.json()["kind"] == "not_available"
        too_long = served.post([{"src": "1" * 2000}])
        assert too_long.status_code == 413, too_long.text
    finally:
        served.stop()


def test_the_ctranslate2_engine_serves_an_exported_decoder_greedy_as_the_cli_and_streams_it(
    decoder, tmp_path
):
    import json

    pytest.importorskip("ctranslate2", reason="--engine ctranslate2 needs CTranslate2")
    exported = tmp_path / "ct2"
    _attnkit("export", "--ckpt", decoder, "--to", "ctranslate2", "--out", exported)
    prompts, decode = ["the cat", "the fox sat", "the"], ["decode.max_new_tokens=12", "decode.temperature=0"]
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("\n".join(prompts) + "\n", encoding="utf-8")
    printed = _attnkit("generate", "--engine", "ctranslate2", "--ckpt", exported, "-i", prompts_file, *decode)
    expected = [json.loads(line)["text"] for line in printed.splitlines()]
    served = Server(exported, "--engine", "ctranslate2", *decode, steps=None)
    try:
        with ThreadPoolExecutor(3) as clients:
            answers = list(clients.map(lambda p: httpx.post(f"{served.url}/generate", json={"inputs": p},
                                                            timeout=60), prompts))  # fmt: skip
        assert [answer.json()["generated_text"] for answer in answers] == expected
        stream = httpx.post(f"{served.url}/generate_stream", json={"inputs": prompts[1]}, timeout=60)
        events = [json.loads(event) for event in _events(stream)]
        assert len(events) > 2 and "".join(e["token"]["text"] for e in events) == expected[1]
        assert events[-1]["generated_text"] == expected[1]
        seeded = {"inputs": "the", "parameters": {"seed": 3, "temperature": 1.0}}
        refused = httpx.post(f"{served.url}/generate", json=seeded, timeout=60)
        assert refused.status_code == 422 and refused.json()["error"].startswith("seed: ctranslate2"), (
            refused.text
        )
    finally:
        served.stop()


def test_the_ctranslate2_engine_refuses_a_folder_it_cannot_serve_in_one_line(run):
    serve = [sys.executable, "-m", "attnkit", "serve", "--engine", "ctranslate2"]
    result = subprocess.run([*serve, "--ckpt", str(run)], capture_output=True, text=True, encoding="utf-8")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "not a CTranslate2 folder from 'attnkit export --to ctranslate2'" in result.stderr
    int8 = subprocess.run(
        [*serve, "--int8", "--ckpt", str(run)], capture_output=True, text=True, encoding="utf-8"
    )
    assert int8.returncode == 2 and "--quantization int8" in int8.stderr


def test_the_server_decodes_without_drafts_it_does_not_check_and_says_so_in_one_line(run, monkeypatch):
    """``decode.speculative`` asks a translator for its draft decoder, which this checkpoint lacks: loading
    it is refused in one line that says how to make one. Where a served model checks no such drafts
    (the captioner and the recogniser check none; here a translator made to check none), the server
    says so and loads the model without them (``shallow`` would look for the missing draft)."""
    from attnkit.errors import AttnkitError
    from attnkit.serve.choosing import attnkit_model
    from attnkit.serve.translator import ServedTranslator

    heard: list[str] = []
    served, load = attnkit_model(run, ["decode.speculative=shallow"], warn=heard.append)
    with pytest.raises(AttnkitError, match="attnkit distill-draft --ckpt") as refused:
        load()
    assert not heard and "\n" not in str(refused.value)
    monkeypatch.setattr(ServedTranslator, "drafts", ())
    served, load = attnkit_model(run, ["decode.speculative=shallow"], warn=heard.append)
    assert len(heard) == 1 and "the server checks no such drafts yet" in heard[0], heard
    assert isinstance(load(), served)
