"""A captioner served (the app in this process, over httpx's test transport): uploaded images get the
captions ``attnkit predict --image`` gives them, in their order, batched together; what is not an
upload of images of the model's size is one clear JSON error, a decompression bomb among them, at the
cost of its header; uploads are decoded on the batcher's worker, once queued; a form that cannot be
read is a 400 saying why; ``/explore`` asks for an image and answers one with the caption explorer's
page; ``attnkit serve`` picks the captioner's endpoints."""

import io
import json
import re
import threading
import time

import matplotlib.image
import pytest
import torch

pytest.importorskip("fastapi", reason="attnkit serve needs FastAPI: pip install 'attnkit[serve]'")
pytest.importorskip("sklearn", reason="the scenes draw scikit-learn's bundled digits")
from fastapi.testclient import TestClient

from attnkit.data.digit_scenes import digit_scenes
from attnkit.decode.captions import caption
from attnkit.loading import load_for_inference
from attnkit.serve.app import make_app
from attnkit.serve.captioner import ServedCaptioner
from attnkit.serve.choosing import attnkit_model
from attnkit.serve.state import ServeSettings
from attnkit.tasks.captioning import pixels
from tests.images import bomb, untrained_captioner


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return untrained_captioner(tmp_path_factory.mktemp("captioner") / "run")


@pytest.fixture(scope="module")
def client(run):
    settings = ServeSettings(max_wait_ms=50)
    with TestClient(make_app(ServedCaptioner, lambda: ServedCaptioner.load(run, []), settings)) as client:
        for _ in range(200):  # the model loads in a thread after the server starts
            if client.get("/health").status_code == 200:
                break
            time.sleep(0.05)
        yield client


def _png(image: torch.Tensor) -> bytes:
    written = io.BytesIO()
    matplotlib.image.imsave(written, image.numpy(), cmap="gray", vmin=0, vmax=255, format="png")
    return written.getvalue()


def test_uploaded_images_get_the_clis_captions_in_order(client, run):
    scenes = digit_scenes("test", 5, seed=4)
    model, tokenizer, config = load_for_inference(run)
    expected = caption(model, tokenizer, pixels(scenes.images), config.decode)
    files = [("image", (f"scene{i}.png", _png(scenes.images[i]), "image/png")) for i in range(5)]
    answer = client.post("/predict", files=files)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"outputs": [{"caption": text} for text in expected]}
    one = client.post("/predict", files=files[3:4])
    assert one.json() == {"outputs": [{"caption": expected[3]}]}


def test_what_is_not_an_upload_of_images_of_the_models_size_is_one_clear_error(client):
    scene = digit_scenes("test", 1, seed=4).images[0]
    for request, status, said in (
        ({"json": {"inputs": ["a 3"]}}, 415, "upload them as multipart/form-data fields named image"),
        ({"files": [("picture", ("a.png", _png(scene), "image/png"))]}, 422, "image: no file uploaded"),
        ({"files": [("image", ("notes.png", b"not an image", "image/png"))]}, 422,
         "image: notes.png: not a PNG or JPEG image"),
        ({"files": [("image", ("small.png", _png(scene[:40, :40]), "image/png"))]}, 422,
         "image: small.png: an image of (40, 40) pixels; this model reads (48, 48)"),
    ):  # fmt: skip
        answer = client.post("/predict", **request)
        assert answer.status_code == status and said in answer.json()["error"], answer.text
    assert client.get("/health").status_code == 200  # and the server goes on


def test_a_decompression_bomb_or_another_format_is_a_422_and_no_pixel_is_decoded(client, no_decoding):
    for data, said in (
        (bomb(8000), "image: bomb.png: an image of (8000, 8000) pixels; this model reads (48, 48)"),
        (bomb(30000, depth=1), "image: bomb.png: an image of 900,000,000 pixels, past the"),
        (b"II*\x00" + b"\x00" * 200, "image: bomb.png: not a PNG or JPEG image"),  # a TIFF's signature
    ):
        for path in ("/predict", "/explore"):
            answer = client.post(path, files=[("image", ("bomb.png", data, "image/png"))])
            assert answer.status_code == 422 and said in answer.json()["error"], answer.text


def test_an_image_is_decoded_on_the_batchers_worker_once_queued(client, monkeypatch):
    threads = []
    decode = ServedCaptioner.decode_input

    def recorded(self, upload):
        threads.append(threading.current_thread().name)
        return decode(self, upload)

    monkeypatch.setattr(ServedCaptioner, "decode_input", recorded)
    scene = digit_scenes("test", 1, seed=4).images[0]
    answer = client.post("/predict", files=[("image", ("scene.png", _png(scene), "image/png"))])
    assert answer.status_code == 200 and threads and all(t.startswith("attnkit-model") for t in threads)
    broken = _png(scene)[:150]  # its header is whole: the size is right, the pixels cut short
    answer = client.post("/predict", files=[("image", ("cut.png", broken, "image/png"))])
    assert (
        answer.status_code == 422 and "image: cut.png: not an image this can read" in answer.json()["error"]
    )


def test_a_form_that_cannot_be_read_is_a_400_saying_why(client):
    too_many = [("image", (f"{i}.png", b"x", "image/png")) for i in range(257)]
    answer = client.post("/predict", files=too_many)
    assert answer.status_code == 400 and answer.json()["kind"] == "malformed_form"
    assert "Too many files" in answer.json()["error"], answer.text
    answer = client.post("/predict", content=b"--x\r\n", headers={"content-type": "multipart/form-data"})
    assert answer.status_code == 400 and answer.json()["kind"] == "malformed_form", answer.text
    assert "the request body is not JSON" not in answer.text


def test_explore_asks_for_an_image_and_shows_the_caption_word_by_word(client, run):
    form = client.get("/explore")
    assert form.status_code == 200 and 'enctype="multipart/form-data"' in form.text
    assert client.get("/explore", params={"text": "a 3"}).status_code == 400  # it reads no text
    scene = digit_scenes("test", 1, seed=5).images[0]
    page = client.post("/explore", files=[("image", ("scene.png", _png(scene), "image/png"))])
    assert page.status_code == 200 and 'enctype="multipart/form-data"' in page.text
    found = re.search(r'<script type="application/json" id="caption-data">(.*?)</script>', page.text, re.S)
    data = json.loads(found.group(1))
    model, tokenizer, config = load_for_inference(run)
    assert data["views"][0]["caption"] == caption(model, tokenizer, pixels(scene[None]), config.decode)[0]
    assert data["image"] == scene.tolist()


def test_attnkit_serve_serves_a_captioner_with_its_endpoints(run):
    served, _ = attnkit_model(run, [])
    assert served is ServedCaptioner and served.dialects == ("uploads",)
