"""A speech recogniser served (the app in this process, over httpx's test transport): uploaded WAV files
get the transcripts ``attnkit predict --audio`` gives them, in their order, batched together, a file at
another rate resampled as the CLI resamples it; what is not an upload of WAV files this reads (a
malformed one, an absurd rate, a clip too short) is one clear JSON error, and a request over the batch
budget a 413 in annotations, known from the header before a feature is computed; ``/explore`` asks for
a WAV file and answers one with the speech explorer's page, within the same budget and the explorer's;
``attnkit serve`` picks the recogniser's endpoints."""

import io
import json
import re
import time
import wave

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("fastapi", reason="attnkit serve needs FastAPI: pip install 'attnkit[serve]'")
from fastapi.testclient import TestClient

from attnkit.cli import app
from attnkit.data.audio import heard, wav_from_bytes
from attnkit.decode.transcripts import alignments_while_spelling, transcribe
from attnkit.loading import load_for_inference
from attnkit.serve.app import make_app
from attnkit.serve.choosing import attnkit_model
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
         "audio: click.wav: 10 ms of sound, shorter than the 42 ms that 2 frames of features take"),
        ({"files": _files([long])}, 413,
         "body: 117 annotations, more than the server's --max-batch-tokens 100"),
        ({"files": _files(SOUNDS * 3)}, 413, "annotations, more than the server's --max-batch-tokens 100"),
    ):  # fmt: skip
        answer = client.post("/predict", **request)
        assert answer.status_code == status and said in answer.json()["error"], answer.text
    assert client.get("/health").status_code == 200  # and the server goes on


def test_a_malformed_wav_or_an_absurd_rate_is_a_422_and_a_long_one_a_413_before_any_feature(
    client, monkeypatch
):
    from attnkit.serve import recogniser

    def refuse(*args, **kwargs):
        raise AssertionError("features were computed")

    monkeypatch.setattr(recogniser, "heard", refuse)
    cut = SOUNDS[0][:40] + (10**6).to_bytes(4, "little") + SOUNDS[0][44:1001]  # 16 bits cut on an odd byte
    # a million 8-bit samples declared at 100 Hz (under 1 MiB): 10,000 s, a million frames of features
    slow = _eight_bit(np.zeros(1_000_000), 100)
    long = _eight_bit(np.zeros(1_000_000), 8000)  # 125 s at 8 kHz: 12,497 frames, 2,083 annotations of 6
    for sound, status, said in (
        (slow, 422, "audio: said0.wav: a sample rate of 100 Hz; this reads 8,000 to 96,000 Hz"),
        (wav_bytes(chirp(1.0, 1), rate=40), 422, "audio: said0.wav: a sample rate of 40 Hz"),
        (cut, 422, "audio: said0.wav: its sound stops mid-sample"),
        (wav_bytes(chirp(0.028, 1)), 422, "audio: said0.wav: 28 ms of sound, shorter than the 42 ms"),
        (long, 413, "body: 2083 annotations, more than the server's --max-batch-tokens 100"),
    ):
        for path in ("/predict", "/explore"):
            answer = client.post(path, files=_files([sound]))
            assert answer.status_code == status and said in answer.json()["error"], (path, answer.text)


def _eight_bit(samples: np.ndarray, rate: int) -> bytes:
    written = io.BytesIO()
    with wave.open(written, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(1)
        out.setframerate(rate)
        out.writeframes((samples * 127 + 128).astype(np.uint8).tobytes())
    return written.getvalue()


def test_a_wav_at_another_rate_gets_the_transcript_the_cli_gives_it(client, run, tmp_path):
    sound = wav_bytes(chirp(1.5, 7)[::2], rate=8000)  # 1.5 s at 8 kHz
    path = tmp_path / "slow.wav"
    path.write_bytes(sound)
    result = CliRunner().invoke(app, ["predict", "--ckpt", str(run), "--audio", str(path)])
    assert result.exit_code == 0, result.output
    answer = client.post("/predict", files=_files([sound]))
    assert answer.json() == {"outputs": [{"transcript": result.stdout.split("\n")[0]}]}


def test_explore_is_bounded_by_the_batch_budget_and_the_explorers(run):
    settings = ServeSettings(max_batch_tokens=40, max_explore_tokens=20)
    with TestClient(make_app(ServedRecogniser, lambda: ServedRecogniser.load(run, []), settings)) as client:
        for _ in range(200):
            if client.get("/health").status_code == 200:
                break
            time.sleep(0.05)
        for seconds, said in (
            (3.0, "body: 50 annotations, more than the server's --max-batch-tokens 40"),
            (2.0, "audio: 33 annotations, more than the explorer's 20 (--max-explore-tokens)"),
        ):
            answer = client.post("/explore", files=_files([wav_bytes(chirp(seconds, 2))]))
            assert answer.status_code == 413 and said in answer.json()["error"], answer.text
        assert client.post("/explore", files=_files([wav_bytes(chirp(1.0, 2))])).status_code == 200


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
    features = heard(wav_from_bytes(SOUNDS[3], "said3.wav"), 16000)  # (147, 40): 1.5 s, frames every 10 ms
    (transcript,) = transcribe(model, tokenizer, [features], config.decode)
    ids, weights = alignments_while_spelling(model, tokenizer, [features], [transcript], "cpu")
    (view,) = data["views"]
    assert view["transcript"] == transcript and view["letters"] == tokenizer.tokens(ids[0])
    assert torch.allclose(torch.tensor(view["weights"]), weights[0, : len(ids[0])], atol=1e-4)
    assert len(data["spectrogram"]) == len(features) == 147
    two = client.post("/explore", files=_files(SOUNDS[:2]))
    assert two.status_code == 422 and "audio: 2 files; the explorer shows one" in two.json()["error"]


def test_attnkit_serve_serves_a_recogniser_with_its_endpoints(run):
    served, load = attnkit_model(run, [])
    assert served is ServedRecogniser and served.dialects == ("uploads",)
    assert isinstance(load(), ServedRecogniser)
