"""attnkit serve --batching continuous through a real server process: concurrent requests with different
beams and n-best lists, joining a running batch at any step, get exactly the CLI's outputs; the
metrics show the running batch; the attention explorer still runs between steps; SIGTERM finishes."""

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx", reason="the server tests need httpx: pip install 'attnkit[test]'")
pytest.importorskip("fastapi", reason="attnkit serve needs FastAPI: pip install 'attnkit[serve]'")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from attnkit.data.synthetic import dates  # noqa: E402
from tests.serve.servers import Server  # noqa: E402

pytestmark = pytest.mark.slow  # a trained model and a server process

SENTENCES = dates(32, seed=11).src


def _cli(run, tmp_path, beam, n_best=0, overrides=()):
    source = tmp_path / "dates.txt"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    command = ["translate", "--ckpt", str(run), "-i", str(source), "--beam", str(beam), *overrides]
    if n_best:
        command += ["--n-best", str(n_best)]
    result = subprocess.run([sys.executable, "-m", "attnkit", *command], capture_output=True, text=True,
                            encoding="utf-8", check=True)  # fmt: skip
    return result.stdout.splitlines()


def _samples(server):
    text = httpx.get(f"{server.url}/metrics").text
    samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    return {sample.name: sample.value for sample in samples}


# float32: in bf16 a sentence's output may depend on what else its batch holds, in any batching and in
# attnkit translate itself (oneDNN's bf16 products round differently for other numbers of rows)
@pytest.mark.parametrize(
    "overrides",
    [("decode.precision=fp32",), ("decode.precision=fp32", "decode.compile=true")],
    ids=["model's steps", "compiled steps"],
)
def test_32_clients_joining_a_running_batch_get_the_cli_outputs(run, tmp_path, overrides):
    expected = {1: _cli(run, tmp_path, 1, 0, overrides), 4: _cli(run, tmp_path, 4, 0, overrides)}
    n_best = [line.split(" ||| ") for line in _cli(run, tmp_path, 4, 2, overrides)]  # LINE ||| TEXT ||| SCORE
    served = Server(run, "--batching", "continuous", "decode.streams=2", *overrides)
    try:

        def ask(i):
            beam, best = (1, 1) if i % 3 == 0 else (4, 2 if i % 3 == 2 else 1)
            response = served.post([{"src": SENTENCES[i], "beam_size": beam, "n_best": best}])
            assert response.status_code == 200, response.text
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


def test_continuous_batching_is_refused_in_one_line_where_there_is_no_running_batch(run, tmp_path):
    command = [sys.executable, "-m", "attnkit", "serve", "--ckpt", str(run), "--batching", "always"]
    bad = subprocess.run(command, capture_output=True, text=True, encoding="utf-8")
    assert bad.returncode != 0 and "--batching always: choose one of auto, continuous, batches" in bad.stderr
