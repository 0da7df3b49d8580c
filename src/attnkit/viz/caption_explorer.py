"""The caption explorer: what one or more captioners write for an image, and where each looked as it
wrote each word (Show, Attend and Tell's figure, Xu et al. 2015 Fig. 2–3, in a browser), the models
side by side: soft attention beside hard, the RNN captioner beside the Transformer.

:func:`caption_view` captions the image with one model (its run's decode settings) and reads back the
attention over the regions at each step that wrote a word (decode/captions.py); :func:`caption_page`
writes the views into a page that needs nothing but a browser (``viz/caption_explorer.html``: the data
inline, nothing fetched): each word over the image lit where the model attended, the most attended
region outlined, a word enlarged on hover. ``attnkit explore --image`` writes it, ``attnkit serve``'s
``/explore`` answers an uploaded image with it.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass
from importlib import resources

import torch
from torch import Tensor

from attnkit.config import DecodeConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.captions import attention_while_writing, caption
from attnkit.models.captioner import DOWNSAMPLING
from attnkit.tasks.captioning import pixels
from attnkit.viz.explorer import DIGITS, PLACEHOLDER, json_for_html


@dataclass
class CaptionView:
    """One model's caption of the image, and its attention as it wrote each word."""

    name: str  # the model's name (its checkpoint folder)
    caption: str
    words: list[str]  # the caption's tokens
    weights: list[list[float]]  # per word: the weight of each region, row by row of the grid


@torch.no_grad()
def caption_view(
    model: torch.nn.Module, tokenizer: Tokenizer, decode: DecodeConfig, image: Tensor, name: str
) -> CaptionView:
    """What ``model`` writes for ``image`` (``(H, W)`` 8-bit grey levels, of the model's size), by
    ``decode``'s search, and where it attended at each word."""
    images = pixels(image[None])  # (1, 1, H, W) in [0, 1], as the task's scenes
    written = caption(model, tokenizer, images, decode)[0]
    ids, weights = attention_while_writing(model, tokenizer, images, [written])  # weights (1, T, L)
    rows = weights[0, : len(ids[0])].float().round(decimals=DIGITS).tolist()
    return CaptionView(name, written, tokenizer.tokens(ids[0]), rows)


def caption_page(image: Tensor, views: list[CaptionView], title: str, form: str = "") -> str:
    """The self-contained page of ``views`` of ``image`` (``(H, W)`` grey levels); ``form``: HTML put on
    top (the server's upload form). The title is escaped and the data is HTML-safe JSON, as the
    attention explorer's (viz/explorer.py)."""
    template = resources.files("attnkit.viz").joinpath("caption_explorer.html").read_text(encoding="utf-8")
    data = {
        "image": image.tolist(),
        "grid": image.size(-1) // DOWNSAMPLING,
        "views": [asdict(v) for v in views],
    }
    filled = {"__TITLE__": html.escape(title), "__FORM__": form, "__DATA__": json_for_html(data)}
    return PLACEHOLDER.sub(lambda found: filled[found.group(0)], template)
