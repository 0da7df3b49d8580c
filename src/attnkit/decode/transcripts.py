"""Transcripts of utterances by a trained speech recogniser (models/listen_attend_spell.py), searched
as captions and translations are (decode/captions.py's :func:`~attnkit.decode.captions.written`):
greedy for a beam of 1, beam search otherwise. Utterances go in batches of ``decode.batch_size`` of
similar lengths (less padding), and come back in their order."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnkit.attention.invariance import KEY_BUCKET
from attnkit.config import DecodeConfig
from attnkit.data.batching import length_batches, pad
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.captions import written
from attnkit.decode.search import Search
from attnkit.decode.starts import searching
from attnkit.errors import AttnkitError


def padded_frames(features: Sequence[Tensor], multiple: int = 1) -> Tensor:
    """Utterances' features ``(frames, n_mels)`` as one batch ``(B, T, n_mels)``, zero frames after
    each one's end (what the model reads its lengths from), ``T`` rounded up to a ``multiple``."""
    batch = torch.nn.utils.rnn.pad_sequence(list(features), batch_first=True)
    return torch.nn.functional.pad(batch, (0, 0, 0, -batch.size(1) % multiple))


@torch.no_grad()
def transcribe(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    features: Sequence[Tensor],
    decode: DecodeConfig,
    *,
    beam_size: int | None = None,
    device: torch.device | str = "cpu",
) -> list[str]:
    """The transcript of each utterance of ``features`` (each ``(frames, n_mels)``), by ``decode``'s
    beam (or ``beam_size``). It checks no drafts (``decode.speculative``: said in one line)."""
    if decode.speculative != "none":
        raise AttnkitError(
            f"decode.speculative={decode.speculative}: a speech recogniser checks no drafts (an utterance "
            "has no text to copy them from, and its speller takes no draft model); decode.speculative=none"
        )
    search = Search.of(decode, beam_size=beam_size or decode.beam_size, max_output_len=model.config.max_len)
    # batches of one padded width of annotations, padded to it: the speller's attention then takes a
    # batch in one call, as an utterance alone (attnkit.attention.invariance)
    annotations = [model.config.annotations(len(f)) for f in features]
    batches = length_batches(range(len(features)), annotations, decode.batch_size, KEY_BUCKET)
    found: dict[int, str] = {}
    with searching(model):
        for rows in batches:
            frames = padded_frames([features[i] for i in rows], KEY_BUCKET * model.config.reduction)
            frames = frames.to(device)  # (B, T, n_mels)
            found.update(zip(rows, written(model, tokenizer, frames, search), strict=True))
    return [found[i] for i in range(len(features))]


@torch.no_grad()
def alignments_while_spelling(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    features: Sequence[Tensor],
    transcripts: list[str],
    device: torch.device | str,
    batch_size: int = 64,
) -> tuple[list[list[int]], Tensor]:
    """Each transcript's tokens, and the attention over the annotations at each step that wrote one of
    them, ``(N, T, S)`` (zero past each utterance's annotations and transcript): ``transcripts`` (what
    the model heard in ``features``) read back teacher-forced."""
    specials = tokenizer.specials
    ids = [tokenizer.encode(text) for text in transcripts]
    parts = []
    with searching(model):
        for start in range(0, len(ids), batch_size):
            tgt_in = pad([[specials.bos, *t] for t in ids[start : start + batch_size]], specials.pad)
            frames = padded_frames(features[start : start + batch_size])
            parts.append(model.alignments(frames.to(device), tgt_in.to(device)).float().cpu())
    steps, places = max(p.size(1) for p in parts), max(p.size(2) for p in parts)
    weights = torch.cat(
        [torch.nn.functional.pad(p, (0, places - p.size(2), 0, steps - p.size(1))) for p in parts]
    )
    return ids, weights
