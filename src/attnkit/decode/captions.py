"""Captions of images by a trained captioner (models/captioner.py), searched by the same code as
translations: greedy search for a beam of 1, beam search otherwise (decode/search.py), each caption at
most the model's ``max_len`` tokens. Images go in batches of ``decode.batch_size``.

A Transformer captioner (models/caption_transformer.py) decodes as the translation model does
(``Seq2SeqDecoding``), so its greedy search checks a smaller captioner's guesses as drafts
(``decode.speculative=PATH``, loaded with it as ``model.draft``; decode/speculative.py): the same
captions, in fewer steps where the draft is right. An image has no source text to copy: ``source``
drafts are refused in one line, and a beam search takes none."""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.config import DecodeConfig
from attnkit.data.batching import pad
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.beams import beam
from attnkit.decode.drafts import ShallowDrafts, require_draft
from attnkit.decode.search import Search, argmax, extend
from attnkit.decode.speculative import Economy, Speculation, economy, speculative_search
from attnkit.decode.starts import searching
from attnkit.errors import AttnkitError


@torch.no_grad()
def caption(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    images: Tensor,
    decode: DecodeConfig,
    *,
    beam_size: int | None = None,
    device: torch.device | str = "cpu",
    speculation: Speculation | None = None,
) -> list[str]:
    """The caption of each image of ``images (N, 1, H, W)`` (pixels in [0, 1]), by ``decode``'s beam
    (or ``beam_size``); greedy search checks the draft captioner's guesses where ``decode.speculative``
    names one and they have paid so far (``Economy``; ``speculation`` counts what they did)."""
    width = beam_size or decode.beam_size
    search = Search.of(decode, beam_size=width, max_output_len=model.config.max_len)
    paying = None
    if width == 1 and decode.speculative != "none":
        if decode.speculative == "source":
            raise AttnkitError(
                "decode.speculative=source copies drafts from a source text, and a caption's input is an "
                "image; a smaller captioner's checkpoint (decode.speculative=PATH) drafts for captions"
            )
        require_draft(model, decode.speculative, "")
        paying = economy(model, f"{decode.speculative}, eager steps")
    found: list[str] = []
    with searching(model):
        for start in range(0, len(images), decode.batch_size):
            batch = images[start : start + decode.batch_size].to(device)  # (B, 1, H, W)
            found += written(model, tokenizer, batch, search, paying, speculation)
    return found


def written(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    inputs: Tensor,
    search: Search,
    paying: Economy | None = None,
    speculation: Speculation | None = None,
) -> list[str]:
    """What ``model`` writes for each row of ``inputs`` (images, an utterance's frames: what its
    ``decoding`` reads) by ``search``: greedy for a beam of 1, beam search otherwise, each output at most
    the model's ``max_len`` tokens. With ``paying``, greedy search checks the guesses of ``model.draft``
    (a model of the same kind over the same inputs) where they have paid so far, and tells it what the
    search took."""
    specials, rows = tokenizer.specials, inputs.size(0)
    first = torch.full((rows, 1), specials.bos, dtype=torch.long, device=inputs.device)
    limits = torch.full((rows,), model.config.max_len, device=inputs.device)
    decoding = model.decoding(inputs)

    def with_drafts() -> list[list[int]]:
        drafts = ShallowDrafts(model.draft.decoding(inputs), specials)  # its own encoding of the inputs
        return speculative_search(decoding, first, limits, specials, drafts, speculation)

    def without() -> list[list[int]]:
        return extend(decoding, first, limits, specials, argmax)

    if search.beam_size > 1:
        outputs = [best[0].tokens for best in beam(decoding, first, limits, specials, search)]
    else:  # greedy search, checking drafts where they have paid (the same outputs either way)
        outputs = without() if paying is None else paying.searched(with_drafts, without)
    return [tokenizer.decode(ids) for ids in outputs]


@torch.no_grad()
def attention_while_writing(
    model: torch.nn.Module, tokenizer: Tokenizer, images: Tensor, captions: list[str]
) -> tuple[list[list[int]], Tensor]:
    """Each caption's tokens, and the attention over the regions at each step that wrote one of
    them, ``(N, T, L)``: ``captions`` (what the model wrote for ``images``) read back teacher-forced."""
    specials = tokenizer.specials
    ids = [tokenizer.encode(text) for text in captions]
    tgt_in = pad([[specials.bos, *t] for t in ids], specials.pad).to(images.device)
    with searching(model):
        return ids, model.alignments(images, tgt_in)
