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
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlparse

import torch

from attnkit.data.batching import make_batch
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.search import greedy
from attnkit.errors import AttnkitError
from attnkit.viz.attention import recording

DIGITS = 4  # weights are written with this many decimals: the page stays small, the picture the same


@dataclass
class AttentionMap:
    """One kind of attention of a model on one input: ``weights[layer][head][query][key]``."""

    name: str  # "encoder self-attention", "decoder self-attention", "cross-attention", "self-attention"
    queries: list[str]  # the token of each row
    keys: list[str]  # the token of each column
    weights: list[list[list[list[float]]]]


def _maps(name: str, modules: list, queries: list[str], keys: list[str]) -> AttentionMap:
    """The recorded weights of ``modules`` (one per layer), batch row 0: ``(h, T_q, T_k)`` each."""
    layers = [m.last_weights[0].float().round(decimals=DIGITS).tolist() for m in modules]
    return AttentionMap(name, queries, keys, layers)


@torch.no_grad()
def collect_attention(
    model: torch.nn.Module, tokenizer: Tokenizer, text: str, target: str | None = None
) -> tuple[list[AttentionMap], str | None]:
    """Every attention of ``model`` on ``text``: the maps, and for an encoder-decoder the output they
    belong to (``target`` if given, else the model's greedy translation)."""
    arch = getattr(model.config, "arch", None)
    ids, s = tokenizer.encode(text), tokenizer.specials
    if not ids:
        raise AttnkitError("--text is empty: give a sentence to look at")
    model.eval()
    if arch == "encoder-decoder":
        limit = model.config.max_len - 1
        src = torch.tensor([[*ids[:limit], s.eos]])
        out = (
            tokenizer.encode(target) if target is not None else greedy(model, src, s, max_output_len=limit)[0]
        )
        batch = make_batch([ids[:limit]], [out[:limit]], s)
        encoder = [layer.self_attn for layer in model.encoder.layers]
        self_attn = [layer.self_attn for layer in model.decoder.layers]
        cross = [layer.src_attn for layer in model.decoder.layers]
        with recording(encoder + self_attn + cross):
            model(batch.src, batch.tgt_in)
        source, output = tokenizer.tokens(batch.src[0].tolist()), tokenizer.tokens(batch.tgt_in[0].tolist())
        maps = [
            _maps("encoder self-attention", encoder, source, source),
            _maps("decoder self-attention", self_attn, output, output),
            _maps("cross-attention", cross, output, source),
        ]
        return maps, tokenizer.decode(out)
    if arch == "decoder":
        tokens = torch.tensor([ids[: model.config.max_len]])
        modules = [layer.self_attn for layer in model.decoder.layers]
        with recording(modules):
            model(tokens)
        labels = tokenizer.tokens(tokens[0].tolist())
        return [_maps("self-attention", modules, labels, labels)], None
    if arch == "encoder":
        tokens = torch.tensor([[s.bos, *ids[: model.config.max_len - 2], s.eos]])  # [CLS] text [SEP]
        modules = [layer.self_attn for layer in model.encoder.layers]
        with recording(modules):
            model.encode(tokens)
        labels = tokenizer.tokens(tokens[0].tolist())
        return [_maps("self-attention", modules, labels, labels)], None
    raise AttnkitError(
        f"the explorer shows Transformer attention (encoder-decoder, encoder, decoder); this is a "
        f"model.arch={arch!r} model: see its attention with attnkit evaluate --plot"
    )


def explorer_html(
    maps: list[AttentionMap], title: str, output: str | None = None, form_text: str | None = None
) -> str:
    """The self-contained page for ``maps`` (``output``: the translation the maps belong to); with
    ``form_text``, a text box holding it on top, for the local server (:func:`serve`)."""
    template = resources.files("attnkit.viz").joinpath("explorer.html").read_text(encoding="utf-8")
    data = {"title": title, "output": output, "maps": [asdict(m) for m in maps]}
    # "</" would end the script element early: JSON allows "<\/" for it
    payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")
    form = "" if form_text is None else FORM.format(text=html.escape(form_text, quote=True))
    return (
        template.replace("__TITLE__", html.escape(title))
        .replace("__FORM__", form)
        .replace("__DATA__", payload)
    )


FORM = """<form method="get" action="/" id="ask"><input type="text" name="text" value="{text}" size="70">
<button type="submit">show attention</button></form>"""


def serve(model: torch.nn.Module, tokenizer: Tokenizer, name: str, text: str, port: int = 8000) -> None:
    """Serve the explorer on http://127.0.0.1:``port`` with a text box: each sentence typed there is
    run through the model and shown (standard library only; local, one user)."""
    server = explorer_server(model, tokenizer, name, text, port)
    print(f"attention explorer on http://127.0.0.1:{server.server_port}/ (Ctrl-C stops it)", flush=True)
    with server:
        server.serve_forever()


def explorer_server(
    model: torch.nn.Module, tokenizer: Tokenizer, name: str, text: str, port: int = 8000
) -> ThreadingHTTPServer:
    """The server of :func:`serve`, bound to 127.0.0.1 (``port`` 0: any free port), not yet serving."""

    class Explorer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query)
            asked = query.get("text", [text])[0]
            target = query.get("target", [None])[0] or None
            try:
                if not asked.strip():
                    raise AttnkitError("type a sentence to see the model's attention on it")
                maps, output = collect_attention(model, tokenizer, asked, target)
                page, status = explorer_html(maps, f"attention of {name} on: {asked}", output, asked), 200
            except AttnkitError as error:
                page = f"<!DOCTYPE html>{FORM.format(text='')}<p>{html.escape(str(error))}</p>"
                status = 200 if not asked.strip() else 400
            body = page.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # quiet: one line per request is noise here
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Explorer)
