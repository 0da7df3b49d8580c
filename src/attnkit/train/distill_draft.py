"""Teaching a shallow draft decoder (models/draft.py) to guess its model's greedy outputs.

Sequence-level distillation (Kim & Rush, 2016): the model translates a batch of sources greedily, and
the draft learns, by cross-entropy with the model's tokens as targets (teacher forcing on those
tokens), to predict each next token the model chose. Those are exactly the guesses speculative greedy
search wants: at every position, the model's own next token after its own prefix. Only the draft's
layer learns; the encoder, the embeddings and the output layer are the model's, untouched.

It runs against a clock (``minutes``) rather than for a number of epochs: on a CPU the greedy
translations cost as much as the training steps, and a few minutes take a draft most of the way.
Some sources are held out, and the share of their tokens the draft guesses right (its *agreement*
with the model, what a check would take of a one-token draft) is measured before and after.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.data.batching import pad
from attnkit.data.tokenizer import SpecialIds
from attnkit.decode.search import Search, argmax, extend, starts_of
from attnkit.models.draft import ShallowDraft
from attnkit.models.seq2seq import EncoderDecoder
from attnkit.train.schedules import constant, make_scheduler

HELD_OUT = 200  # sources kept back to measure the draft's agreement with the model (of fewer: a quarter)
POOL = 50  # batches drawn at a time, sorted by length within (less padding)
WARMUP = 100  # steps of the learning rate's linear warm-up


@dataclass
class Distilled:
    """What distillation made: the draft, how often it agreed with the model on the held-out sources'
    greedy translations before and after, over how many tokens, and what it learnt from."""

    draft: ShallowDraft
    agreement_before: float
    agreement_after: float
    held_out_tokens: int
    sentences: int
    steps: int
    seconds: float


def distill_draft(
    model: EncoderDecoder,
    sources: list[list[int]],
    specials: SpecialIds,
    search: Search,
    *,
    minutes: float,
    batch_size: int = 64,
    lr: float = 5e-4,
    seed: int = 1,
    progress: Callable[[int], None] | None = None,
) -> Distilled:
    """A draft for ``model`` (float32, as trained), taught for ``minutes`` on the greedy translations
    (bounded by ``search``) of ``sources`` (ids with ``</s>``; :data:`HELD_OUT` of them kept back, or
    a quarter of fewer than four times as many). ``progress`` hears how many sentences each step
    learnt from."""
    torch.manual_seed(seed)
    order = list(range(len(sources)))
    random.Random(seed).shuffle(order)
    held = [sources[i] for i in order[: min(HELD_OUT, len(order) // 4)]]
    learn = [sources[i] for i in order[len(held) :]]
    model.eval().requires_grad_(False)
    draft = ShallowDraft(model)
    held_out = _translated(model, held, specials, search) if held else None
    before = agreement(draft, held_out, specials.pad) if held_out else (0.0, 0)
    optimizer = torch.optim.Adam(draft.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    # a rate rising linearly over the first steps (Adam's noisiest), then constant
    scheduler = make_scheduler(optimizer, lambda step: constant(step, lr, WARMUP))
    began, steps, sentences = time.perf_counter(), 0, 0
    rng = random.Random(seed + 1)
    while time.perf_counter() - began < minutes * 60:
        for batch in _batches(learn, batch_size, rng):
            if time.perf_counter() - began >= minutes * 60:
                break
            src, tgt_in, tgt_out = _translated(model, batch, specials, search)
            draft.train()
            scores = draft(src, tgt_in)  # (B, T, V)
            loss = _loss(scores, tgt_out, specials.pad, draft.pointer is not None)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            steps, sentences = steps + 1, sentences + len(batch)
            if progress is not None:
                progress(len(batch))
    draft.eval()
    after = agreement(draft, held_out, specials.pad) if held_out else (0.0, 0)
    seconds = time.perf_counter() - began
    return Distilled(draft, before[0], after[0], after[1], sentences, steps, seconds)


def _batches(sources: list[list[int]], size: int, rng: random.Random):
    """Batches of ``size`` sources in a random order, each of sources of like lengths."""
    order = list(range(len(sources)))
    rng.shuffle(order)
    for start in range(0, len(order), size * POOL):
        pool = sorted(order[start : start + size * POOL], key=lambda i: len(sources[i]))
        batches = [pool[i : i + size] for i in range(0, len(pool), size)]
        rng.shuffle(batches)
        for batch in batches:
            yield [sources[i] for i in batch]


@torch.no_grad()
def _translated(
    model: EncoderDecoder, sources: list[list[int]], specials: SpecialIds, search: Search
) -> tuple[Tensor, Tensor, Tensor]:
    """``sources`` padded ``(B, S)`` and the model's greedy translations of them as the decoder reads
    them, ``<s>`` first ``(B, T)``, and as it predicts them, ``</s>`` last ``(B, T)``."""
    src = pad(sources, specials.pad)
    start, limits = starts_of(src, specials, search)
    outputs = extend(model.decoding(src), start, limits, specials, argmax)
    tgt_in = pad([[specials.bos, *ids] for ids in outputs], specials.pad)
    tgt_out = pad([[*ids, specials.eos] for ids in outputs], specials.pad)
    return src, tgt_in, tgt_out


def _loss(scores: Tensor, targets: Tensor, pad_id: int, log_probs: bool) -> Tensor:
    """The mean cross-entropy of ``scores (B, T, V)`` (logits, or log-probabilities with the copy
    mechanism) against ``targets (B, T)``, padding left out."""
    flat, wanted = scores.reshape(-1, scores.size(-1)), targets.reshape(-1)
    if log_probs:
        return F.nll_loss(flat, wanted, ignore_index=pad_id)
    return F.cross_entropy(flat, wanted, ignore_index=pad_id)


@torch.no_grad()
def agreement(
    draft: ShallowDraft, translated: tuple[Tensor, Tensor, Tensor], pad_id: int
) -> tuple[float, int]:
    """The share of the model's greedy tokens ``translated`` (as :func:`_translated` gives them) that
    the draft, reading the model's tokens before each, guesses itself; and how many tokens."""
    src, tgt_in, tgt_out = translated
    draft.eval()
    guesses = draft(src, tgt_in).argmax(-1)  # (B, T)
    real = tgt_out != pad_id
    count = int(real.sum())
    return float((guesses.eq(tgt_out) & real).sum()) / max(count, 1), count
