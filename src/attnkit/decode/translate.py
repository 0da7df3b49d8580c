"""Text in, text out: tokenise, batch by length, search, restore the input order, detokenise."""

from __future__ import annotations

import torch

from attnkit.config import DecodeConfig
from attnkit.data.batching import pad
from attnkit.data.tokenizer import EOS_ID, Tokenizer
from attnkit.decode.search import beam_search, greedy
from attnkit.models.seq2seq import EncoderDecoder


def translate(
    model: EncoderDecoder,
    tokenizer: Tokenizer,
    texts: list[str],
    decode: DecodeConfig,
    *,
    beam_size: int | None = None,
    device: torch.device | str = "cpu",
) -> list[str]:
    """Translate ``texts``; ``beam_size`` 1 is greedy search, default ``decode.beam_size``.

    An empty (or all-space) input line gives an empty output line without running the model.
    """
    beam = decode.beam_size if beam_size is None else beam_size
    encoded = tokenizer.encode_batch(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))  # similar lengths share a batch
    outputs = [""] * len(texts)
    was_training = model.training
    model.eval()
    try:
        todo = [i for i in order if texts[i].strip()]
        for start in range(0, len(todo), decode.batch_size):
            chunk = todo[start : start + decode.batch_size]
            src = pad([encoded[i] + [EOS_ID] for i in chunk]).to(device)
            if beam == 1:
                ids = greedy(model, src, decode.max_len_a, decode.max_len_b)
            else:
                hyps = beam_search(model, src, beam, decode.alpha, decode.max_len_a, decode.max_len_b)
                ids = [h[0].tokens for h in hyps]
            for i, hyp in zip(chunk, ids, strict=True):
                outputs[i] = tokenizer.decode(hyp)
    finally:
        model.train(was_training)
    return outputs
