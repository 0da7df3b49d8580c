"""The speech explorer: what one or more speech recognisers hear in an utterance, and where each
listened as it spelled each character (Listen, Attend and Spell's alignment figure, Chan et al. 2016
Fig. 2, in a browser), the models side by side on one spectrogram: location-aware attention beside
plain additive attention.

:func:`speech_view` transcribes the utterance with one model (its run's decode settings) and reads back
the attention over the annotations at each step that spelled a character (decode/transcripts.py);
:func:`speech_page` writes the views into a page that needs nothing but a browser
(``viz/speech_explorer.html``: the data inline, nothing fetched): the log-mel spectrogram, and under it
each model's character × frame alignment on the same time axis; hovering a character lights the frames
it attended on the spectrogram. ``attnkit explore --audio`` writes it, ``attnkit serve``'s ``/explore``
answers an uploaded WAV file with it.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass
from importlib import resources

import torch
from torch import Tensor

from attnkit.config import DecodeConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.transcripts import alignments_while_spelling, transcribe
from attnkit.viz.explorer import DIGITS, PLACEHOLDER, json_for_html

FEATURE_DIGITS = 2  # the spectrogram's values (normalised log energies, about -3 to 3) as written


@dataclass
class SpeechView:
    """One model's transcript of the utterance, and its attention as it spelled each character."""

    name: str  # the model's name (its checkpoint folder)
    transcript: str
    letters: list[str]  # the transcript's tokens (characters)
    reduction: int  # frames per annotation: each weight stands for this many frames
    weights: list[list[float]]  # per character: the weight of each annotation, in time order


@torch.no_grad()
def speech_view(
    model: torch.nn.Module, tokenizer: Tokenizer, decode: DecodeConfig, features: Tensor, name: str
) -> SpeechView:
    """What ``model`` hears in ``features`` (``(frames, n_mels)``, data/audio.py's ``log_mel``), by
    ``decode``'s search, and where it attended at each character."""
    heard = transcribe(model, tokenizer, [features], decode)[0]
    ids, weights = alignments_while_spelling(model, tokenizer, [features], [heard], "cpu")  # (1, T, S)
    annotations = model.config.annotations(len(features))  # the utterance's own, not the batch's padding
    rows = weights[0, : len(ids[0]), :annotations].float().round(decimals=DIGITS).tolist()
    return SpeechView(name, heard, tokenizer.tokens(ids[0]), model.config.reduction, rows)


def speech_page(features: Tensor, views: list[SpeechView], title: str, form: str = "") -> str:
    """The self-contained page of ``views`` of the utterance ``features`` (``(frames, n_mels)``);
    ``form``: HTML put on top (the server's upload form). The title is escaped and the data is
    HTML-safe JSON, as the attention explorer's (viz/explorer.py)."""
    template = resources.files("attnkit.viz").joinpath("speech_explorer.html").read_text(encoding="utf-8")
    spectrogram = features.float().round(decimals=FEATURE_DIGITS).tolist()  # (frames, n_mels)
    data = {"spectrogram": spectrogram, "views": [asdict(v) for v in views]}
    filled = {"__TITLE__": html.escape(title), "__FORM__": form, "__DATA__": json_for_html(data)}
    return PLACEHOLDER.sub(lambda found: filled[found.group(0)], template)
