"""A token stream cut into blocks of a model's context, for language modelling (GPT): each block of
``T`` tokens with its targets, the same tokens one later. Training takes whole blocks from a random
offset (tasks/language_modelling.py); evaluation reads the whole stream in consecutive blocks
(:func:`stream_blocks`), as training validates, ``attnkit evaluate`` scores a text and CTranslate2's
engine scores it too."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import DataError


@dataclass
class Blocks:
    """A batch of text blocks: the tokens, and the tokens that follow each of them."""

    inputs: Tensor  # (B, T)
    targets: Tensor  # (B, T)
    n_tokens: int

    def to(self, device: torch.device | str) -> Blocks:
        return Blocks(self.inputs.to(device), self.targets.to(device), self.n_tokens)


def stream_blocks(ids: Tensor, block: int, per_batch: int) -> Iterator[Blocks]:
    """All of a token stream ``ids`` for evaluation: consecutive blocks of ``block`` tokens, each
    predicting the tokens one later, so that every token but the first is predicted once, from the
    tokens before it in its block; ``per_batch`` whole blocks a batch, then the rest, shorter than a
    block, in a batch of its own."""
    span = len(ids) - 1  # predicted tokens
    whole = list(range(0, span - block + 1, block))
    for i in range(0, len(whole), per_batch):
        yield blocks_at(ids, whole[i : i + per_batch], block)
    tail = len(whole) * block
    if tail < span:
        yield blocks_at(ids, [tail], span - tail)


def text_ids(tokenizer: Tokenizer, text: str) -> Tensor:
    """``text`` as one stream of token ids ``(N,)`` to score; an error if it predicts nothing (N < 2)."""
    ids = torch.tensor(tokenizer.encode(text))
    if len(ids) < 2:
        raise DataError(f"the text has {len(ids)} token(s); a language model predicts from the second on")
    return ids


def blocks_at(ids: Tensor | np.ndarray, starts: list[int], length: int) -> Blocks:
    """The blocks of ``length`` tokens at ``starts``, with their targets; ``ids`` may be a store's
    memory-mapped stream, of which only these blocks are read."""
    rows = torch.stack([torch.as_tensor(np.asarray(ids[s : s + length + 1], dtype=np.int64)) for s in starts])
    return Blocks(rows[:, :-1], rows[:, 1:], rows.size(0) * length)  # rows: (B, length + 1)
