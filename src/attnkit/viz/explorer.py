"""The attention explorer: every layer and head of a trained Transformer on one input, as one HTML page.

:func:`collect_attention` runs the model once with every attention module recording its weights (the
reference path, ``need_weights``): an encoder-decoder on a source sentence and its own greedy output (or
a given target), an encoder or a decoder on a text. :func:`explorer_html` writes them into a page that
needs nothing but a browser: the data, script and styles are inline, nothing is fetched. The page
(``viz/explorer.html``) shows a layers × heads grid per attention, an enlarged matrix with the tokens,
a token view (hover a token: lines to what it attends, as bertviz's head view), an average over heads,
and for cross-attention each output token's most attended source token.
"""

from __future__ import annotations

import html
import json
import re
import traceback
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlparse

import torch

from attnkit.attention.recording import Recording, recording
from attnkit.data.batching import make_batch
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.search import Search, greedy
from attnkit.errors import AttnkitError
from attnkit.models import DecoderModel, EncoderDecoder, EncoderModel

DIGITS = 4  # weights are written with this many decimals: the page stays small, the picture the same


@dataclass
class AttentionMap:
    """One kind of attention of a model on one input: ``weights[layer][head][query][key]``."""

    name: str  # "encoder self-attention", "decoder self-attention", "cross-attention", "self-attention"
    queries: list[str]  # the token of each row
    keys: list[str]  # the token of each column
    weights: list[list[list[list[float]]]]


def _maps(name: str, modules: list, recorded: Recording, queries: list[str], keys: list[str]) -> AttentionMap:
    """The recorded weights of ``modules`` (one per layer), batch row 0: ``(h, T_q, T_k)`` each."""
    layers = [recorded[m][0].float().round(decimals=DIGITS).tolist() for m in modules]
    return AttentionMap(name, queries, keys, layers)


@torch.no_grad()
def collect_attention(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    text: str,
    target: str | None = None,
    limit: int | None = None,
) -> tuple[list[AttentionMap], str | None]:
    """Every attention of ``model`` on ``text``: the maps, and for an encoder-decoder the output they
    belong to (``target`` if given, else the model's greedy translation). ``limit``: the tokens of the
    text and of the output shown at most (the maps, and so the page, grow with their square); the
    model's positions at most in any case."""
    ids, s = tokenizer.encode(text), tokenizer.specials
    if not ids:
        raise AttnkitError("--text is empty: give a sentence to look at")
    if limit is not None:
        ids = ids[:limit]
    model.eval()
    if isinstance(model, EncoderDecoder):
        limit = min(model.config.max_len - 1, limit or model.config.max_len)
        src = torch.tensor([[*ids[:limit], s.eos]])
        out = (
            tokenizer.encode(target)
            if target is not None
            else greedy(model, src, s, Search(max_output_len=limit))[0]
        )
        batch = make_batch([ids[:limit]], [out[:limit]], s)
        encoder = [layer.self_attn for layer in model.encoder.layers]
        self_attn = [layer.self_attn for layer in model.decoder.layers]
        cross = [layer.src_attn for layer in model.decoder.layers]
        with recording(encoder + self_attn + cross) as recorded:
            model(batch.src, batch.tgt_in)
        source, output = tokenizer.tokens(batch.src[0].tolist()), tokenizer.tokens(batch.tgt_in[0].tolist())
        maps = [
            _maps("encoder self-attention", encoder, recorded, source, source),
            _maps("decoder self-attention", self_attn, recorded, output, output),
            _maps("cross-attention", cross, recorded, output, source),
        ]
        return maps, tokenizer.decode(out)
    if isinstance(model, DecoderModel):
        tokens = torch.tensor([ids[: model.config.max_len]])
        modules = [layer.self_attn for layer in model.decoder.layers]
        with recording(modules) as recorded:
            model(tokens)
        labels = tokenizer.tokens(tokens[0].tolist())
        return [_maps("self-attention", modules, recorded, labels, labels)], None
    if isinstance(model, EncoderModel):
        tokens = torch.tensor([[s.bos, *ids[: model.config.max_len - 2], s.eos]])  # [CLS] text [SEP]
        modules = [layer.self_attn for layer in model.encoder.layers]
        with recording(modules) as recorded:
            model.encode(tokens)
        labels = tokenizer.tokens(tokens[0].tolist())
        return [_maps("self-attention", modules, recorded, labels, labels)], None
    arch = getattr(model.config, "arch", None)
    raise AttnkitError(
        f"the explorer shows Transformer attention (encoder-decoder, encoder, decoder); this is a "
        f"model.arch={arch!r} model: see its attention with attnkit evaluate --plot"
    )


def explorer_html(
    maps: list[AttentionMap],
    title: str,
    output: str | None = None,
    form_text: str | None = None,
    action: str = "/",
) -> str:
    """The self-contained page for ``maps`` (``output``: the translation the maps belong to); with
    ``form_text``, a text box holding it on top that asks ``action`` (the local server's :func:`serve`
    at "/", ``attnkit serve``'s at "/explore").

    Every text here may be the user's (a sentence from a URL of the server, its tokens, the model's
    output), so none of it becomes markup: the title and the text box are HTML-escaped, and the data is
    JSON with ``<``, ``>`` and ``&`` written as ``\\u003c``... (no ``</script>`` or ``<!--`` can end or
    bend its script element; ``JSON.parse`` reads them back as they were). The placeholders are filled
    in one pass, so text that holds a placeholder's name stays text."""
    template = resources.files("attnkit.viz").joinpath("explorer.html").read_text(encoding="utf-8")
    data = {"title": title, "output": output, "maps": [asdict(m) for m in maps]}
    form = "" if form_text is None else FORM.format(text=html.escape(form_text, quote=True), action=action)
    filled = {"__TITLE__": html.escape(title), "__FORM__": form, "__DATA__": json_for_html(data)}
    return PLACEHOLDER.sub(lambda found: filled[found.group(0)], template)


PLACEHOLDER = re.compile("__(?:TITLE|FORM|DATA)__")
FORM = """<form method="get" action="{action}" id="ask">
<input type="text" name="text" value="{text}" size="70">
<button type="submit">show attention</button></form>"""
_HTML_SAFE_JSON = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def json_for_html(value: object) -> str:
    """``value`` as JSON that may stand inside an HTML ``<script>`` element: no character of it can start
    a tag, a comment or an entity (the escapes Django's ``json_script`` uses)."""
    return json.dumps(value, ensure_ascii=False).translate(_HTML_SAFE_JSON)


def serve(model: torch.nn.Module, tokenizer: Tokenizer, name: str, text: str, port: int = 8000) -> None:
    """Serve the explorer on http://127.0.0.1:``port`` with a text box: each sentence typed there is
    run through the model and shown (standard library only; for one local user, not a public server)."""
    server = explorer_server(model, tokenizer, name, text, port)
    print(f"attention explorer on http://127.0.0.1:{server.server_port}/ (Ctrl-C stops it)", flush=True)
    with server:
        server.serve_forever()


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # connections waiting to be accepted; the standard library's 5 refuses a burst


def explorer_server(
    model: torch.nn.Module, tokenizer: Tokenizer, name: str, text: str, port: int = 8000
) -> ThreadingHTTPServer:
    """The server of :func:`serve`, bound to 127.0.0.1 (``port`` 0: any free port), not yet serving; a
    port that cannot be bound is one line naming it. Requests run on threads of their own over the one
    model; each records its own attention (attention/recording.py), so each gets its own page."""

    class Explorer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query)
            asked = query.get("text", [text])[0]
            target = query.get("target", [None])[0] or None
            try:
                page, status = explorer_page(model, tokenizer, name, asked, target)
            except Exception as error:  # a bug: answered (and logged below), never a dropped connection
                self.log_error("%s", traceback.format_exc())
                page, status = message_page(f"the explorer failed on this input ({error!r})"), 500
            body = page.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # quiet: one line per request is noise here
            pass

    if not 0 <= port <= 65535:
        raise AttnkitError(f"--port {port}: a port is a number from 0 to 65535")
    try:
        return _Server(("127.0.0.1", port), Explorer)
    except OSError as error:
        raise AttnkitError(
            f"--port {port}: cannot serve on 127.0.0.1:{port} ({error.strerror or error}); "
            "choose another port, or 0 for any free one"
        ) from None


def explorer_page(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    name: str,
    asked: str,
    target: str | None,
    action: str = "/",
    limit: int | None = None,
) -> tuple[str, int]:
    """The page for one sentence typed in a text box that asks ``action``, and its HTTP status: the
    attention of ``model`` on ``asked`` (at most ``limit`` tokens of it and of the output), or what to
    do (200, nothing asked yet), or what was wrong (400: a sentence the model cannot take)."""
    try:
        if not asked.strip():
            raise AttnkitError("type a sentence to see the model's attention on it")
        maps, output = collect_attention(model, tokenizer, asked, target, limit)
        return explorer_html(maps, f"attention of {name} on: {asked}", output, asked, action), 200
    except AttnkitError as error:
        return message_page(str(error), action), 200 if not asked.strip() else 400


def message_page(message: str, action: str = "/", form: str = FORM) -> str:
    """A page with the text box (or another ``form``, asking ``action``) and one message (an error, or
    what to do)."""
    return f"<!DOCTYPE html>{form.format(text='', action=action)}<p>{html.escape(message)}</p>"
