"""Token-budget batching: batches of similar-length sentences, each holding at most ``max_tokens``.

The paper batched "by approximate sequence length", each batch holding about 25,000 source and 25,000
target tokens (§5.1). Sorting by length before cutting batches keeps padding small; the order of
batches (and of equal-length sentences) is reshuffled every epoch from ``(seed, epoch)``, so that
a run is reproducible and a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attnkit.data.tokenizer import SpecialIds


def token_batches(
    src_lengths: Sequence[int] | np.ndarray,
    tgt_lengths: Sequence[int] | np.ndarray,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """Indices of examples grouped into batches whose padded size ``count × longest`` fits ``max_tokens``.

    Examples are sorted by (source, target) length, equal lengths in a random order, and cut greedily
    into batches; a single example longer than ``max_tokens`` still gets a batch of its own. All of it
    is numpy on the lengths arrays, so that millions of examples (a prepared store's) cost a second
    and a few bytes each, not a Python object each.
    """
    src = np.asarray(src_lengths, dtype=np.int32)  # (N,): 4 bytes an example (lengths are short)
    tgt = np.asarray(tgt_lengths, dtype=np.int32)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(src)) if shuffle else np.arange(len(src))
    order = order[np.lexsort((tgt[order], src[order]))]  # stable: equal lengths keep their random order
    size = np.maximum(np.maximum(src, tgt)[order], 1)  # (N,) each example's padded length, in order
    ends = _greedy_cuts(size, max_tokens)
    batches = np.split(order, ends[:-1])
    if shuffle:
        batches = [batches[k] for k in rng.permutation(len(batches))]
    return batches


def _greedy_cuts(size: np.ndarray, max_tokens: int) -> list[int]:
    """Where each batch ends when examples of padded lengths ``size`` are taken in order while
    ``count × longest`` fits ``max_tokens``.

    A batch that starts at an example of length ``s`` holds at most ``max_tokens // s`` examples (its
    longest is at least ``s``), so each cut looks at one window that long, in numpy: the Python loop
    runs once per batch, not once per example."""
    ends, start, n = [], 0, len(size)
    while start < n:
        window = size[start : start + max(1, max_tokens // int(size[start]))]
        longest = np.maximum.accumulate(window)  # the batch's longest if it ended at each example
        fits = longest * np.arange(1, len(window) + 1) <= max_tokens
        fits[0] = True  # one example always makes a batch
        count = len(window) if fits.all() else int(np.argmin(fits))
        start += count
        ends.append(start)
    return ends


def length_batches(
    indices: Iterable[int], lengths: Sequence[int], size: int, bucket: int | None = None
) -> list[list[int]]:
    """``indices`` in batches of at most ``size``, ordered by ``lengths[i]`` so that similar lengths
    share a batch (less padding when decoding). With a ``bucket``, a batch holds the lengths of one
    ``⌈length / bucket⌉`` only: every sequence of it is padded to the width it gets alone (the speech
    recogniser's speller then attends over a batch in one call, as over an utterance alone:
    decode/transcripts.py)."""
    order = sorted(indices, key=lengths.__getitem__)
    runs = [order]
    if bucket is not None:
        runs = [list(run) for _, run in itertools.groupby(order, key=lambda i: -(-lengths[i] // bucket))]
    return [run[i : i + size] for run in runs for i in range(0, len(run), size)]


@dataclass
class Batch:
    """Padded tensors for one batch: the source, the target shifted right, and the target to predict."""

    src: Tensor  # (B, S): tokens + </s>
    tgt_in: Tensor  # (B, T): <s> + tokens
    tgt_out: Tensor  # (B, T): tokens + </s>
    n_tokens: int  # target tokens that count towards the loss (not padding)

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device), self.n_tokens)


def consecutive(n: int, size: int) -> list[list[int]]:
    """Indices ``0 .. n-1`` in runs of at most ``size``: the batches of an epoch, validation or a test."""
    return [list(range(start, min(start + size, n))) for start in range(0, n, size)]


def padded_width(longest: int, multiple: int = 1, most: int | None = None) -> int:
    """The width :func:`pad` gives ``longest`` ids: rounded up to a ``multiple``, but not past ``most``
    (a model's positions) unless ``longest`` is longer still."""
    width = -(-longest // multiple) * multiple
    return max(longest, min(width, most)) if most is not None else width


def pad(sequences: list[list[int]], pad_id: int, multiple: int = 1, most: int | None = None) -> Tensor:
    """Right-pad lists of ids with ``pad_id`` into a ``(B, width)`` tensor: the longest rounded up to a
    ``multiple``, but not past ``most`` (a model's positions)."""
    width = padded_width(max(map(len, sequences)), multiple, most)
    out = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    for row, ids in enumerate(sequences):
        out[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def make_batch(src: list[list[int]], tgt: list[list[int]], specials: SpecialIds) -> Batch:
    """Add the specials and pad: source ``x </s>``, decoder input ``<s> y``, decoder target ``y </s>``."""
    return Batch(
        src=pad([[*s, specials.eos] for s in src], specials.pad),
        tgt_in=pad([[specials.bos, *t] for t in tgt], specials.pad),
        tgt_out=pad([[*t, specials.eos] for t in tgt], specials.pad),
        n_tokens=sum(len(t) + 1 for t in tgt),
    )


def encoder_input(first: list[int], specials: SpecialIds, second: list[int] | None = None):
    """BERT's input layout (§3): ``[CLS] first [SEP]``, or ``[CLS] first [SEP] second [SEP]`` for a pair
    (a question and its passage), and the token type (segment) of each position: 0 up to the first
    ``[SEP]``, 1 after it. Our own vocabularies play ``[CLS]``/``[SEP]`` with ``<s>``/``</s>``."""
    ids = [specials.bos, *first, specials.eos]
    types = [0] * len(ids)
    if second is not None:
        ids += [*second, specials.eos]
        types += [1] * (len(second) + 1)
    return ids, types


@dataclass
class EncoderBatch:
    """Padded inputs of an encoder-only model and the task's targets (labels, masked tokens, spans)."""

    ids: Tensor  # (B, T)
    token_types: Tensor  # (B, T)
    targets: tuple[Tensor, ...]
    n_tokens: int  # the number of predictions the loss sums over (tokens, sentences or answers)

    def to(self, device: torch.device | str) -> EncoderBatch:
        return EncoderBatch(
            self.ids.to(device),
            self.token_types.to(device),
            tuple(t.to(device) for t in self.targets),
            self.n_tokens,
        )
