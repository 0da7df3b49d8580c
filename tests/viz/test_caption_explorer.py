"""The caption explorer: the page carries each captioner's own caption of the image and its attention as
it wrote each word (what ``decode.captions`` gives), ``attnkit explore --image`` puts several captioners
side by side and refuses what it cannot show in one line, and in a real browser (Chromium, driven by
Playwright) each word's picture is lit where that word's attention is."""

import json
import re

import matplotlib.image
import pytest
import torch
from typer.testing import CliRunner

from attnkit.checkpoint.folder import CheckpointContents, save_checkpoint
from attnkit.cli import app
from attnkit.config import RunConfig
from attnkit.decode.captions import attention_while_writing, caption
from attnkit.models import build_model, from_preset
from attnkit.tasks.captioning import caption_tokenizer, pixels
from attnkit.viz.caption_explorer import caption_page, caption_view
from tests.cli.checks import one_line_error
from tests.viz.browser import opened_in_chromium

pytest.importorskip("sklearn", reason="the scenes draw scikit-learn's bundled digits")
from attnkit.data.digit_scenes import digit_scenes

PRESETS = {"soft": "captioner-tiny", "transformer": "caption-transformer-tiny"}


@pytest.fixture(scope="module")
def scene():
    return digit_scenes("test", 1, seed=3).images[0]  # (48, 48) grey levels


@pytest.fixture(scope="module")
def captioners(tmp_path_factory):
    """An untrained RNN captioner and Transformer captioner (their captions need only be their own),
    saved as runs."""
    tokenizer = caption_tokenizer()
    runs = {}
    for name, preset in PRESETS.items():
        torch.manual_seed(0)
        config = from_preset(preset, max_len=8)
        model = build_model(config, tokenizer.vocab_size).eval()
        run = tmp_path_factory.mktemp(name) / "run"
        run_config = RunConfig.for_model(config).to_dict()
        save_checkpoint(run, 1, CheckpointContents(model, run_config, tokenizer.to_str()), is_best=True)
        runs[name] = (run, model)
    return tokenizer, runs


def _page_data(page_html: str) -> dict:
    found = re.search(r'<script type="application/json" id="caption-data">(.*?)</script>', page_html, re.S)
    return json.loads(found.group(1))


def test_a_view_is_the_models_own_caption_and_attention(captioners, scene):
    tokenizer, runs = captioners
    _, model = runs["transformer"]
    config = RunConfig.for_model(model.config)
    view = caption_view(model, tokenizer, config.decode, scene, "transformer")
    images = pixels(scene[None])
    written = caption(model, tokenizer, images, config.decode)[0]
    ids, weights = attention_while_writing(model, tokenizer, images, [written])
    assert view.caption == written and view.words == tokenizer.tokens(ids[0])
    assert torch.allclose(torch.tensor(view.weights), weights[0, : len(ids[0])], atol=1e-4)
    data = _page_data(caption_page(scene, [view], "<title> & such"))
    assert data["image"] == scene.tolist() and data["grid"] == 6 and data["views"][0]["caption"] == written


def test_explore_puts_captioners_side_by_side_on_an_image(captioners, scene, tmp_path):
    tokenizer, runs = captioners
    image = tmp_path / "scene.png"
    matplotlib.image.imsave(image, scene.numpy(), cmap="gray", vmin=0, vmax=255)
    page = tmp_path / "captions.html"
    ckpts = [a for run, _ in runs.values() for a in ("--ckpt", str(run))]
    result = CliRunner().invoke(app, ["explore", *ckpts, "--image", str(image), "-o", str(page)])
    assert result.exit_code == 0, result.output
    text = page.read_text(encoding="utf-8")
    views = _page_data(text)["views"]
    assert [v["name"] for v in views] == [str(run) for run, _ in runs.values()]
    for view, (_, model) in zip(views, runs.values(), strict=True):
        assert view["caption"] == caption(model, tokenizer, pixels(scene[None]), RunConfig().decode)[0]
    assert "http://" not in text  # fetches nothing
    runner = CliRunner()
    run = str(runs["soft"][0])
    small = tmp_path / "small.png"
    matplotlib.image.imsave(small, scene[:40, :40].numpy(), cmap="gray")
    for arguments, said in (
        (["--image", str(small)], r"small.png: an image of \(40, 40\) pixels; this model reads \(48, 48\)"),
        ([], r"holds a captioner: give --image FILE to caption"),
        (["--image", str(image), "--text", "a 3"], r"--image shows captioners on an image"),
    ):
        one_line_error(runner.invoke(app, ["explore", "--ckpt", run, *arguments, "-o", str(page)]), said)


def test_the_page_in_a_real_browser_lights_each_words_regions(captioners, scene, tmp_path):
    tokenizer, runs = captioners
    views = [
        caption_view(model, tokenizer, RunConfig.for_model(model.config).decode, scene, name)
        for name, (_, model) in runs.items()
    ]
    page_file = tmp_path / "captions.html"
    page_file.write_text(caption_page(scene, views, "caption explorer test"), encoding="utf-8")
    with opened_in_chromium(page_file, "caption_explorer.png") as page:
        models = page.locator(".model")
        assert models.count() == 2
        for m, view in enumerate(views):
            box = models.nth(m)
            assert box.locator(".strip .word").count() == 1 + len(view.words)  # the image, then each word
            t = len(view.words) - 1
            box.locator(".strip .word").nth(1 + t).hover()
            assert view.words[t] in box.locator(".enlarged div").inner_text()
            weights = torch.tensor(view.weights[t])
            # the enlarged canvas (6 px a pixel, 8 pixels a region): the centre of the most attended
            # region is tinted orange, that of the least attended one is the grey of the image
            colours = box.locator(".enlarged canvas").evaluate(
                """(canvas, regions) => regions.map(i => {
                       const x = (i % 6) * 48 + 24, y = Math.floor(i / 6) * 48 + 24;
                       return Array.from(canvas.getContext("2d").getImageData(x, y, 1, 1).data);
                   })""",
                [int(weights.argmax()), int(weights.argmin())],
            )
            (red, _, blue, _), (low_red, _, low_blue, _) = colours
            assert red - blue > 40, colours
            expected_tint = 0.75 * float(weights.min() / weights.max()) * 255
            assert low_red - low_blue <= expected_tint + 2, colours
