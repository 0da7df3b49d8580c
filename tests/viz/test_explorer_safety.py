"""The explorer page and server under hostile or concurrent use: text a user types (or a link carries)
never becomes markup in the page, and concurrent requests each get the page of their own sentence,
none dropped. The page is parsed with ``html.parser``, as a browser would tokenise it, not grepped."""

import json
import random
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser

import pytest
import torch
from typer.testing import CliRunner

from attnkit import build_transformer
from attnkit.attention.recording import recording
from attnkit.checkpoint.folder import CheckpointContents, save_checkpoint
from attnkit.cli import app
from attnkit.config import RunConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.viz.explorer import AttentionMap, collect_attention, explorer_html, explorer_server
from tests.cli.checks import one_line_error

# every placeholder of the template, and every way out of a text, an attribute or a script element
HOSTILE = ["__TITLE__", "__FORM__", "__DATA__", "<script>alert(1)</script>", "<!--", "-->", "</script>",
           "<img src=x onerror=alert(1)>", '" autofocus onfocus="alert(1)', "&lt;b&gt;", "</title><b>",
           "<![CDATA[", "]]>"]  # fmt: skip
WORDS = ["a", "small", "dog", "runs", "two", "men", "sit", "on", "bench", "woman", "reads", "book",
         "the", "cat", "big", "red", "house"]  # fmt: skip


class Tokens(HTMLParser):
    """What a browser's tokeniser sees: every start tag with its attributes, every comment, the text of
    each element that holds text (title, h1, script, p)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list]] = []
        self.comments: list[str] = []
        self.text: dict[str, list[str]] = {}
        self._open: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))
        self._open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, attrs))

    def handle_endtag(self, tag):
        if self._open and self._open[-1] == tag:
            self._open.pop()

    def handle_comment(self, data):
        self.comments.append(data)

    def handle_data(self, data):
        if self._open:
            self.text.setdefault(self._open[-1], []).append(data)


def _parsed(page: str) -> Tokens:
    tokens = Tokens()
    tokens.feed(page)
    tokens.close()
    return tokens


def _page(words: list[str]) -> str:
    text = " ".join(words)
    maps = [AttentionMap("cross-attention", words, words[::-1], [[[[0.5] * len(words)] * len(words)]])]
    return explorer_html(maps, f"attention of run on: {text}", output=text, form_text=text)


def test_user_text_never_becomes_markup():
    """Every placeholder, a script, a comment and an attribute break-out, through the title, the text
    box, the tokens and the output: the page has exactly the tags and comments of a harmless one, and
    the data, the title and the text box read back exactly as given."""
    hostile, harmless = _page(HOSTILE), _page(["word"] * len(HOSTILE))
    seen, expected = _parsed(hostile), _parsed(harmless)
    strip_value = lambda tags: [(t, [(k, None if k == "value" else v) for k, v in a]) for t, a in tags]  # noqa: E731
    assert strip_value(seen.tags) == strip_value(expected.tags)
    assert seen.comments == expected.comments
    text = " ".join(HOSTILE)
    assert "".join(seen.text["title"]) == "".join(seen.text["h1"]) == f"attention of run on: {text}"
    assert dict(next(a for t, a in seen.tags if t == "input"))["value"] == text
    scripts = seen.text["script"]
    assert len(scripts) == len(expected.text["script"])
    data = json.loads(scripts[0])
    assert data["output"] == text and data["title"] == f"attention of run on: {text}"
    assert data["maps"][0]["queries"] == HOSTILE and data["maps"][0]["keys"] == HOSTILE[::-1]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train("word", [" ".join(WORDS)] * 3, min_frequency=1)


@pytest.fixture(scope="module")
def translator(tokenizer):
    torch.manual_seed(0)
    return build_transformer("tiny", tokenizer.vocab_size).eval()


def test_a_recording_belongs_to_its_thread(translator, tokenizer):
    """Thread A records, thread B then runs the same model inside a recording of its own: A still holds
    the weights of its own input, B those of its own, and a forward pass outside any recording keeps
    nothing (weights kept on the module would hand A the weights of B's input)."""
    module = translator.encoder.layers[0].self_attn
    one, two = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[8, 9, 2]])
    encode = lambda src: translator.encode(src, None)  # noqa: E731
    a_recorded, b_done = threading.Event(), threading.Event()
    results = {}

    def a():
        with recording([module]) as recorded:
            encode(one)
            a_recorded.set()
            b_done.wait(10)
            results["a"] = recorded[module]

    def b():
        a_recorded.wait(10)
        encode(one)  # outside a recording: nothing is kept anywhere
        with recording([module]) as recorded:
            encode(two)
        results["b"] = recorded[module]
        b_done.set()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    with recording([module]) as alone:
        encode(one)
    torch.testing.assert_close(results["a"], alone[module], rtol=0, atol=0)
    assert results["b"].shape == (1, module.h, 3, 3)


def _maps_of(page: str) -> list:
    tokens = _parsed(page)
    return json.loads(tokens.text["script"][0])["maps"]


def test_concurrent_requests_each_get_their_own_page(translator, tokenizer):
    """32 different sentences at once: 32 answers, each the page its sentence gets alone."""
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(32)]
    server = explorer_server(translator, tokenizer, "tiny", "", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}/"

    def get(text: str) -> str:
        query = urllib.parse.urlencode({"text": text})
        with urllib.request.urlopen(f"{base}?{query}", timeout=120) as answer:
            return answer.read().decode()

    try:
        start = threading.Barrier(len(texts))
        with ThreadPoolExecutor(len(texts)) as pool:
            pages = list(pool.map(lambda t: (start.wait(), get(t))[1], texts))
    finally:
        server.shutdown()
        server.server_close()
    for text, page in zip(texts, pages, strict=True):
        maps, output = collect_attention(translator, tokenizer, text)
        assert _maps_of(page) == _maps_of(explorer_html(maps, "alone", output)), text


def test_a_hostile_link_to_the_server_gets_an_inert_page(translator, tokenizer):
    """The sentence of a link (?text=...) reaches the page only as text."""
    server = explorer_server(translator, tokenizer, "tiny", "", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    text = "a dog " + " ".join(HOSTILE)
    try:
        url = f"http://127.0.0.1:{server.server_port}/?" + urllib.parse.urlencode({"text": text})
        page = urllib.request.urlopen(url, timeout=60).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    tags = [tag for tag, _ in _parsed(page).tags]
    assert "img" not in tags and "b" not in tags and tags.count("script") == 2
    assert not any(
        k.startswith("on") or k == "autofocus" for _, attrs in _parsed(page).tags for k, _ in attrs
    )


def test_a_port_in_use_is_one_line(translator, tokenizer, tmp_path):
    run = tmp_path / "run"
    config = RunConfig.for_model(translator.config).to_dict()
    save_checkpoint(run, 1, CheckpointContents(translator, config, tokenizer.to_str()), is_best=True)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["explore", "--ckpt", str(run), "--serve", "--port", str(port)])
        one_line_error(result, rf"--port {port}: cannot serve on 127\.0\.0\.1:{port} \(.+\)")
    result = CliRunner().invoke(app, ["explore", "--ckpt", str(run), "--serve", "--port", "70000"])
    one_line_error(result, r"--port 70000: a port is a number from 0 to 65535")
