"""The attention explorer: the weights the page carries are the model's own (``need_weights=True`` on
the same input), ``attnkit explore`` writes a page for each Transformer architecture and refuses others
in one line, and in a real browser (Chromium, driven by Playwright) the page loads without console
errors, shows layers × heads panels, and clicking a head or hovering a token shows that head's weights."""

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attnkit import build_transformer
from attnkit.attention.masks import padding_mask
from attnkit.attention.recording import recording
from attnkit.checkpoint.folder import CheckpointContents, save_checkpoint
from attnkit.cli import app
from attnkit.data.tokenizer import Tokenizer
from attnkit.models import DecoderModelConfig, build_model
from attnkit.viz.explorer import collect_attention, explorer_html
from tests.cli.checks import one_line_error
from tests.viz.browser import opened_in_chromium

TEXTS = ["a small dog runs", "two men sit on a bench", "a woman reads a book"]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train("word", TEXTS * 3, min_frequency=1)


@pytest.fixture(scope="module")
def translator(tokenizer):
    torch.manual_seed(0)
    return build_transformer("tiny", tokenizer.vocab_size).eval()


def _page_data(page_html: str) -> dict:
    found = re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page_html, re.S)
    return json.loads(found.group(1).replace("<\\/", "</"))


def test_the_pages_weights_are_the_models_own(translator, tokenizer):
    """Encoder layer 1 and decoder cross-attention of the last layer, recomputed with need_weights=True."""
    text, target = "two men sit on a bench", "a small dog"
    maps, output = collect_attention(translator, tokenizer, text, target)
    assert output == target and [m.name for m in maps] == [
        "encoder self-attention", "decoder self-attention", "cross-attention"
    ]  # fmt: skip
    data = _page_data(explorer_html(maps, "t", output))
    s = tokenizer.specials
    src = torch.tensor([[*tokenizer.encode(text), s.eos]])
    tgt_in = torch.tensor([[s.bos, *tokenizer.encode(target)]])
    with torch.no_grad():
        mask = padding_mask(src, s.pad)
        x = translator.src_pos(translator.src_embed(src))
        first = translator.encoder.layers[0]
        _, weights = first.self_attn(first.sublayer[0].norm(x) if first.sublayer[0].norm_first else x,
                                     mask=mask, need_weights=True)  # fmt: skip
        torch.testing.assert_close(torch.tensor(data["maps"][0]["weights"][0]), weights[0], atol=1e-4, rtol=0)
        memory = translator.encode(src, mask)
        last_cross = translator.decoder.layers[-1].src_attn
        with recording([last_cross]) as recorded:
            translator.decode(memory, mask, tgt_in)
        cross = recorded[last_cross][0]
    torch.testing.assert_close(torch.tensor(data["maps"][2]["weights"][-1]), cross, atol=1e-4, rtol=0)
    assert data["maps"][2]["keys"] == tokenizer.tokens(src[0].tolist())
    assert data["maps"][2]["queries"] == tokenizer.tokens(tgt_in[0].tolist())
    assert "</script>" not in json.dumps(data).replace("</", "<\\/")


def _run(tmp_path, model, tokenizer, arch_config) -> Path:
    run = tmp_path / "run"
    save_checkpoint(run, 1, CheckpointContents(model, arch_config, tokenizer.to_str()), is_best=True)
    return run


def test_explore_writes_a_page_for_a_translator_and_a_decoder_and_refuses_an_rnn(tokenizer, tmp_path):
    from attnkit.config import RunConfig
    from attnkit.models.rnn import RNNConfig

    torch.manual_seed(0)
    translator = build_transformer("tiny", tokenizer.vocab_size)
    decoder_config = DecoderModelConfig(layers=2, d_model=32, h=4, d_ff=64, max_len=32)
    cases = {
        "translator": (translator, RunConfig.for_model(translator.config)),
        "decoder": (build_model(decoder_config, tokenizer.vocab_size), RunConfig.for_model(decoder_config)),
    }
    runner = CliRunner()
    for name, (model, config) in cases.items():
        run = _run(tmp_path / name, model, tokenizer, config.to_dict())
        page = tmp_path / f"{name}.html"
        result = runner.invoke(app, ["explore", "--ckpt", str(run), "--text", "a small dog", "-o", str(page)])
        assert result.exit_code == 0, result.output
        data = _page_data(page.read_text(encoding="utf-8"))
        assert len(data["maps"]) == (3 if name == "translator" else 1)
        assert "http://" not in page.read_text(encoding="utf-8").replace(
            "http://www.w3.org/2000/svg", ""
        )  # fetches nothing
    folder = tmp_path / "a folder"
    folder.mkdir()
    result = runner.invoke(app, ["explore", "--ckpt", str(run), "--text", "a small dog", "-o", str(folder)])
    one_line_error(result, r"a folder: is a folder; give a file name")
    rnn_config = RNNConfig(d_embed=16, d_hidden=16)
    rnn = build_model(rnn_config, tokenizer.vocab_size)
    run = _run(tmp_path / "rnn", rnn, tokenizer, RunConfig.for_model(rnn_config).to_dict())
    result = runner.invoke(app, ["explore", "--ckpt", str(run), "--text", "a small dog"])
    assert result.exit_code == 2 and "attnkit evaluate --plot" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_page_in_a_real_browser(translator, tokenizer, tmp_path):
    maps, output = collect_attention(translator, tokenizer, "two men sit on a bench")
    page_file = tmp_path / "explorer.html"
    page_file.write_text(explorer_html(maps, "explorer test", output), encoding="utf-8")
    layers, heads = len(maps[0].weights), len(maps[0].weights[0])
    with opened_in_chromium(page_file, "explorer.png") as page:
        assert page.locator("#grid canvas.thumb").count() == layers * heads
        # the cross-attention, layer 2, head 3: the matrix shows exactly those weights
        page.locator("#kinds button", has_text="cross-attention").click()
        page.locator('#grid canvas[data-layer="1"][data-head="2"]').click()
        assert "layer 2, head 3" in page.locator("#matrix-caption").inner_text()
        shown = page.eval_on_selector_all(
            "#matrix td", "cells => cells.map(c => [+c.dataset.q, +c.dataset.k, +c.dataset.w])"
        )
        expected = maps[2].weights[1][2]
        assert len(shown) == len(expected) * len(expected[0])
        assert all(abs(w - expected[q][k]) < 1e-9 for q, k, w in shown)
        # hovering output token 1 shows only its lines, with its weights as their opacity
        page.locator('#tokens .query[data-i="1"]').hover()
        shown_lines = (
            "ls => ls.filter(l => l.style.display !== 'none')"
            ".map(l => [+l.dataset.q, +l.dataset.k, +l.getAttribute('stroke-opacity')])"
        )
        visible = page.eval_on_selector_all("#tokens line", shown_lines)
        assert {q for q, _, _ in visible} == {1} and len(visible) == len(expected[1])
        assert all(abs(w - expected[1][k]) < 1e-3 for _, k, w in visible)
        page.locator("#average").check()
        assert page.locator("#grid canvas.thumb").count() == layers
        assert page.locator("#alignment li").count() == len(maps[2].queries)


def test_the_local_server_shows_each_typed_sentence(translator, tokenizer):
    import threading
    import urllib.parse
    import urllib.request

    from attnkit.viz.explorer import explorer_server

    server = explorer_server(translator, tokenizer, "tiny", "", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}/"
    try:
        empty = urllib.request.urlopen(base).read().decode()
        assert 'name="text"' in empty and "type a sentence" in empty
        text = "a woman reads a book"
        page = urllib.request.urlopen(base + "?" + urllib.parse.urlencode({"text": text})).read().decode()
        maps, output = collect_attention(translator, tokenizer, text)
        assert _page_data(page)["maps"] == _page_data(explorer_html(maps, "x", output))["maps"]
        assert f'value="{text}"' in page
    finally:
        server.shutdown()
        server.server_close()
