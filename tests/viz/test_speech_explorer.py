"""The speech explorer: the page carries the utterance's spectrogram and each recogniser's own
transcript with its alignment (what ``decode.transcripts`` gives, up to the utterance's own
annotations), ``attnkit explore --audio`` puts several recognisers side by side and refuses what it
cannot show in one line, and in a real browser (Chromium, driven by Playwright) hovering a character
lights the frames it attended over the spectrogram, as its row of the alignment shows them."""

import json
import re

import pytest
import torch
from typer.testing import CliRunner

from attnkit.cli import app
from attnkit.data.audio import heard, read_wav
from attnkit.decode.transcripts import alignments_while_spelling, transcribe
from attnkit.loading import load_for_inference
from attnkit.viz.speech_explorer import speech_page, speech_view
from tests.cli.checks import one_line_error
from tests.recognisers import chirp, untrained_recogniser, wav_bytes
from tests.viz.browser import opened_in_chromium

ATTENTIONS = ("location", "bahdanau")


@pytest.fixture(scope="module")
def recognisers(tmp_path_factory):
    """Untrained recognisers with location-aware and additive attention, saved as runs."""
    folder = tmp_path_factory.mktemp("recognisers")
    return {
        attention: untrained_recogniser(folder / attention, attention, seed=2) for attention in ATTENTIONS
    }


@pytest.fixture(scope="module")
def utterance(tmp_path_factory):
    """A WAV file of 1.2 seconds, and its features as a recogniser hears them."""
    path = tmp_path_factory.mktemp("sound") / "said.wav"
    path.write_bytes(wav_bytes(chirp(1.2, 5)))
    return path, heard(read_wav(path), 16000)  # (117, 40)


def _page_data(page_html: str) -> dict:
    found = re.search(r'<script type="application/json" id="speech-data">(.*?)</script>', page_html, re.S)
    return json.loads(found.group(1))


def test_a_view_is_the_models_own_transcript_and_alignment_over_the_utterances_annotations(
    recognisers, utterance
):
    _, features = utterance
    model, tokenizer, config = load_for_inference(recognisers["location"])
    view = speech_view(model, tokenizer, config.decode, features, "location")
    (heard,) = transcribe(model, tokenizer, [features], config.decode)
    ids, weights = alignments_while_spelling(model, tokenizer, [features], [heard], "cpu")  # (1, T, S)
    annotations = -(-len(features) // model.config.reduction)  # 117 frames, 6 a piece: 20
    assert view.transcript == heard and view.letters == tokenizer.tokens(ids[0]) and view.reduction == 6
    assert torch.tensor(view.weights).shape == (len(ids[0]), annotations) == (len(ids[0]), 20)
    assert torch.allclose(torch.tensor(view.weights), weights[0, : len(ids[0]), :annotations], atol=1e-4)
    assert torch.allclose(torch.tensor(view.weights).sum(-1), torch.ones(len(ids[0])), atol=1e-3)
    data = _page_data(speech_page(features, [view], "<title> & such"))
    assert torch.allclose(torch.tensor(data["spectrogram"]), features, atol=0.005)
    assert data["views"][0]["transcript"] == heard


def test_explore_puts_recognisers_side_by_side_on_an_utterance(recognisers, utterance, tmp_path):
    path, features = utterance
    page = tmp_path / "speech.html"
    ckpts = [a for run in recognisers.values() for a in ("--ckpt", str(run))]
    result = CliRunner().invoke(app, ["explore", *ckpts, "--audio", str(path), "-o", str(page)])
    assert result.exit_code == 0, result.output
    assert "2 model(s) side by side; each character over its alignment" in result.stdout
    text = page.read_text(encoding="utf-8")
    views = _page_data(text)["views"]
    assert [v["name"] for v in views] == [str(run) for run in recognisers.values()]
    for view, run in zip(views, recognisers.values(), strict=True):
        model, tokenizer, config = load_for_inference(run)
        assert view["transcript"] == transcribe(model, tokenizer, [features], config.decode)[0]
    assert "http://" not in text  # fetches nothing
    run = str(recognisers["location"])
    notes = tmp_path / "notes.wav"
    notes.write_text("not a sound", encoding="utf-8")
    for arguments, said in (
        (["--audio", str(notes)], r"notes.wav: not a WAV file this can read"),
        ([], r"holds a speech recogniser: give --audio FILE to transcribe"),
        (["--audio", str(path), "--text", "the third"], r"--audio shows speech recognisers on an utterance"),
        (["--audio", str(path), "--image", str(path)], r"give --image \(captioners\) or --audio"),
    ):
        one_line_error(CliRunner().invoke(app, ["explore", "--ckpt", run, *arguments, "-o", str(page)]), said)


def test_the_page_in_a_real_browser_lights_the_frames_each_character_attended(
    recognisers, utterance, tmp_path
):
    _, features = utterance
    views = []
    for attention, run in recognisers.items():
        model, tokenizer, config = load_for_inference(run)
        views.append(speech_view(model, tokenizer, config.decode, features, attention))
    page_file = tmp_path / "speech.html"
    page_file.write_text(speech_page(features, views, "speech explorer test"), encoding="utf-8")
    frames, fx = len(features), 900 // len(features)  # the page's pixels a frame: 7 for 117 frames
    with opened_in_chromium(page_file, "speech_explorer.png") as page:
        assert page.locator("#spectrogram").evaluate("c => [c.width, c.height]") == [frames * fx, 40 * 3]
        models = page.locator(".model")
        assert models.count() == 2
        for m, view in enumerate(views):
            box = models.nth(m)
            assert box.locator(".letter").count() == len(view.letters)
            t = len(view.letters) // 2
            box.locator(".letter").nth(t).hover()
            assert box.locator(".letter.active").count() == 1
            # each frame's weight: that of the annotation it belongs to
            weights = torch.tensor(view.weights[t]).repeat_interleave(view.reduction)[:frames]
            # over the spectrogram, each frame lit in proportion to its weight (the strongest 80% white)
            lit = page.locator("#lit").evaluate(
                """(canvas, fx) => {
                       const g = canvas.getContext("2d");
                       return Array.from({length: canvas.width / fx}, (_, f) =>
                           g.getImageData(f * fx + 1, 5, 1, 1).data[3]);
                   }""",
                fx,
            )
            expected = 0.8 * 255 * weights / weights.max()
            assert (torch.tensor(lit, dtype=torch.float) - expected).abs().max() <= 2, (lit, expected)
            # the alignment: each character's row darker where it attended more (row t is outlined)
            grey = box.locator("canvas.alignment").evaluate(
                """(canvas, [fx, row]) => {
                       const g = canvas.getContext("2d");
                       return Array.from({length: canvas.width / fx}, (_, f) =>
                           g.getImageData(f * fx + 1, row * 10 + 5, 1, 1).data[0]);
                   }""",
                [fx, (t + 1) % len(view.letters)],
            )
            other = torch.tensor(view.weights[(t + 1) % len(view.letters)]).repeat_interleave(view.reduction)
            assert (torch.tensor(grey, dtype=torch.float) - 255 * (1 - other[:frames])).abs().max() <= 1.5
