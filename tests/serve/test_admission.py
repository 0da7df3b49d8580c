"""A request is admitted by the work it makes, not only by its input tokens: every row a search holds
(a beam's rows for each source; a prompt's row) counts its input and the longest output it may write,
and a request whose rows would hold more token positions than ``--max-batch-positions`` is a 413 naming
it, whatever few tokens it sends (a wide beam over many short sources; completions asking for many
tokens). The app runs in this process, over httpx's test transport."""

import time

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs FastAPI: pip install 'attnkit[serve]'")
from fastapi.testclient import TestClient

from attnkit.data.synthetic import dates
from attnkit.serve.app import make_app
from attnkit.serve.decoder import ServedDecoder
from attnkit.serve.state import ServeSettings
from attnkit.serve.translator import ServedTranslator

SETTINGS = ServeSettings(max_batch_positions=500, batching="continuous", workers="threads")


def _client(served, load):
    client = TestClient(make_app(served, load, SETTINGS))
    client.__enter__()
    for _ in range(400):  # the model loads in a thread after the server starts
        if client.get("/health").status_code == 200:
            break
        time.sleep(0.05)
    return client


def _positions(lengths: list[int], beam: int, a: float = 1.5, b: int = 10) -> int:
    """A beam search's rows and their positions as docs/serving.md states them: ``beam`` rows a source,
    each its n tokens and the bound on its output, ⌊a·n + b⌋ tokens."""
    return sum(beam * (n + int(a * n + b)) for n in lengths)


def test_a_translation_request_is_refused_by_the_positions_its_beams_would_hold(run):
    client = _client(ServedTranslator, lambda: ServedTranslator.load(run, ["decode.steps=eager"]))
    try:
        sentences = dates(8, seed=3).src
        lengths = [len(text) for text in sentences]  # a character each
        fits = next(k for k in range(8, 0, -1) if _positions(lengths[:k], 4) <= 500)
        answer = client.post(
            "/translator/translate", json=[{"src": s, "beam_size": 4} for s in sentences[:fits]]
        )
        assert answer.status_code == 200, answer.text
        over = sentences[: fits + 1]
        answer = client.post("/translator/translate", json=[{"src": s, "beam_size": 4} for s in over])
        held = f"{_positions(lengths[: fits + 1], 4):,} token positions"
        said = (
            f"body: {held} (its rows' inputs and the longest outputs they may write), more than the server's "
        )
        assert answer.status_code == 413 and answer.json() == {
            "error": f"{said}--max-batch-positions 500",
            "kind": "too_much_work",
        }
        greedy = client.post("/translator/translate", json=[{"src": s, "beam_size": 1} for s in over])
        assert greedy.status_code == 200  # the same sources on one row each fit
    finally:
        client.__exit__(None, None, None)


def test_a_completion_counts_the_tokens_it_may_write(decoder):
    client = _client(ServedDecoder, lambda: ServedDecoder.load(decoder, []))
    try:
        prompts = ["the cat"] * 10  # 7 characters each; the model's context is 64 positions
        answer = client.post("/v1/completions", json={"prompt": prompts, "max_tokens": 5, "seed": 1})
        assert answer.status_code == 200, answer.text  # 10 × (7 + 5) = 120
        answer = client.post("/v1/completions", json={"prompt": prompts, "max_tokens": 50, "seed": 1})
        assert answer.status_code == 413 and answer.json()["kind"] == "too_much_work"  # 10 × (7 + 50)
        assert "body: 570 token positions" in answer.json()["error"]
        answer = client.post("/generate", json={"inputs": "the cat", "parameters": {"max_new_tokens": 1000}})
        assert answer.status_code == 200  # one row: at most the context, 64
    finally:
        client.__exit__(None, None, None)
