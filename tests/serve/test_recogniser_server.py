"""A speech recogniser served (the app in this process, over httpx's test transport): uploaded WAV files
get the transcripts ``attnkit predict --audio`` gives them, in their order, batched together; what is
not an upload of WAV files is one clear JSON error, and a request over the batch budget a 413 in
annotations; ``/explore`` asks for a WAV file and answers one with the speech explorer's page;
``attnkit serve`` picks the recogniser's endpoints."""

import json
import re
import time

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("fastapi", reason="attnkit serve needs FastAPI: pip install 'attnkit[serve]'")
from fastapi.testclient import TestClient

from attnkit.cli import app
from attnkit.cli.serving import _attnkit_model
from attnkit.data.audio import log_mel, wav_from_bytes
from attnkit.decode.transcripts import alignments_while_spelling, transcribe
from attnkit.loading import load_for_inference
from attnkit.serve.app import make_app
from attnkit.serve.recogniser import ServedRecogniser
from attnkit.serve.state import ServeSettings
from tests.recognisers import chirp, untrained_recogniser, wav_bytes

SOUNDS = [wav_bytes(chirp(seconds, seed)) for seed, seconds in enumerate((1.0, 2.0, 0.5, 1.5))]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return untrained_recogniser(tmp_path_factory.mktemp("recogniser") / "run")


@pytest.fixture(scope="module")
def client(run):
    settings = ServeSettings(max_wait_ms=50, max_batch_tokens=100)
    with TestClient(make_app(ServedRecogniser, lambda: ServedRecogniser.load(run, []), settings)) as client:
        for _ in range(200):  # the model loads in a thread after the server starts
            if client.get("/health").status_code == 200:
                break
            time.sleep(0.05)
        yield client


def _files(sounds: list[bytes]) -> list:
    return [("audio", (f"said{i}.wav", sound, "audio/wav")) for i, sound in enumerate(sounds)]


def test_uploaded_wav_files_get_the_clis_transcripts_in_order(client, run, tmp_path):
    paths = []
    for i, sound in enumerate(SOUNDS):
        paths.append(tmp_path / f"said{i}.wav")
        paths[-1].write_bytes(sound)
    result = CliRunner().invoke(
        app, ["predict", "--ckpt", str(run), *[a for p in paths for a in ("--audio", p)]]
    )
    assert result.exit_code == 0, result.output
    expected = result.stdout.split("\n")[: len(SOUNDS)]
    answer = client.post("/predict", files=_files(SOUNDS))
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"outputs": [{"transcript": text} for text in expected]}
    one = client.post("/predict", files=_files(SOUNDS[1:2]))
    assert one.json() == {"outputs": [{"transcript": expected[1]}]}


def test_what_is_not_an_upload_of_wav_files_or_is_over_the_budget_is_one_clear_error(client):
    long = wav_bytes(chirp(7.0, 9))  # 700 frames: 117 annotations of 6 frames, over the budget of 100
    for request, status, said in (
        ({"json": {"inputs": ["the third of may"]}}, 415,
         "this model transcribes speech: upload them as multipart/form-data fields named audio"),
        ({"files": [("sound", ("a.wav", SOUNDS[0], "audio/wav"))]}, 422, "audio: no file uploaded"),
        ({"files": [("audio", ("notes.wav", b"not a sound", "audio/wav"))]}, 422,
         "audio: notes.wav: not a WAV file this can read"),
        ({"files": [("audio", ("click.wav", wav_bytes(chirp(0.01, 1)), "audio/wav"))]}, 422,
         "audio: click.wav: 160 samples, shorter than one 25 ms frame"),
        ({"files": _files([long])}, 413,
         "body: 117 annotations, more than the server's --max-batch-tokens 100"),
        ({"files": _files(SOUNDS * 3)}, 413, "annotations, more than the server's --max-batch-tokens 100"),
    ):  # fmt: skip
        answer = client.post("/predict", **request)
        assert answer.status_code == status and said in answer.json()["error"], answer.text
    assert client.get("/health").status_code == 200  # and the server goes on


def test_explore_asks_for_a_wav_file_and_shows_the_alignment_character_by_character(client, run):
    form = client.get("/explore")
    assert (
        form.status_code == 200
        and 'name="audio"' in form.text
        and 'enctype="multipart/form-data"' in form.text
    )
    asked = client.get("/explore", params={"text": "the third of may"})
    assert asked.status_code == 400 and "this model transcribes speech, it reads no text" in asked.text
    page = client.post("/explore", files=_files(SOUNDS[3:4]))
    assert page.status_code == 200 and 'enctype="multipart/form-data"' in page.text
    found = re.search(r'<script type="application/json" id="speech-data">(.*?)</script>', page.text, re.S)
    data = json.loads(found.group(1))
    model, tokenizer, config = load_for_inference(run)
    features = log_mel(*wav_from_bytes(SOUNDS[3], "said3.wav"))  # (147, 40): 1.5 s, 25 ms frames every 10 ms
    (heard,) = transcribe(model, tokenizer, [features], config.decode)
    ids, weights = alignments_while_spelling(model, tokenizer, [features], [heard], "cpu")
    (view,) = data["views"]
    assert view["transcript"] == heard and view["letters"] == tokenizer.tokens(ids[0])
    assert torch.allclose(torch.tensor(view["weights"]), weights[0, : len(ids[0])], atol=1e-4)
    assert len(data["spectrogram"]) == len(features) == 147
    two = client.post("/explore", files=_files(SOUNDS[:2]))
    assert two.status_code == 422 and "audio: 2 files; the explorer shows one" in two.json()["error"]


def test_attnkit_serve_serves_a_recogniser_with_its_endpoints(run):
    served, load = _attnkit_model(run, [])
    assert served is ServedRecogniser and served.dialects == ("uploads",)
    assert isinstance(load(), ServedRecogniser)
