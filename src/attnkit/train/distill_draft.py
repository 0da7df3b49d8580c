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

A GPT's draft (:func:`distill_causal_draft`) learns alike from prompts cut from a text, each followed
by the model's greedy continuation of it: at every position of prompt and continuation, the model's
own most probable next token is the draft's target.

A draft for speculative *sampling* wants something else: the acceptance rule keeps a guess drawn from
the draft's distribution q with probability min(1, p/q), so a guess is kept with probability
Σ_v min(p_v, q_v) (Leviathan et al., 2023), which is 1 only where q is p. A draft that learnt the
model's argmax is too sure of itself there. With a temperature, the GPT's draft learns from the
model's own samples at that temperature, and at every position the model's whole distribution there
(``softmax(logits / T)``) by the KL divergence KL(p ‖ q) (token-level distillation, Hinton et al.,
2015); its agreement is that expected acceptance.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.data.batching import pad
from attnkit.data.tokenizer import SpecialIds
from attnkit.decode.sampling import distribution, sampler
from attnkit.decode.search import Search, argmax, extend, starts_of
from attnkit.models.decoder_only import DecoderModel
from attnkit.models.draft import ShallowCausalDraft, ShallowDraft
from attnkit.models.seq2seq import EncoderDecoder
from attnkit.train.schedules import constant, make_scheduler

HELD_OUT = 200  # sources kept back to measure the draft's agreement with the model (of fewer: a quarter)
POOL = 50  # batches drawn at a time, sorted by length within (less padding)
WARMUP = 100  # steps of the learning rate's linear warm-up


@dataclass
class Distilled:
    """What distillation made: the draft, how often it agreed with the model on the held-out sources'
    greedy translations (a GPT's: held-out prompts' continuations) before and after, over how many
    tokens, and what it learnt from."""

    draft: ShallowDraft | ShallowCausalDraft
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
    rng = random.Random(seed + 1)
    batches = _endless(learn, batch_size, rng)

    def lesson() -> tuple[Tensor, int]:
        batch = next(batches)
        src, tgt_in, tgt_out = _translated(model, batch, specials, search)
        scores = draft(src, tgt_in)  # (B, T, V)
        return _loss(scores, tgt_out, specials.pad, draft.pointer is not None), len(batch)

    steps, sentences, seconds = _learn(draft, lesson, minutes, lr, progress)
    after = agreement(draft, held_out, specials.pad) if held_out else (0.0, 0)
    return Distilled(draft, before[0], after[0], after[1], sentences, steps, seconds)


def _learn(
    draft: nn.Module,
    lesson: Callable[[], tuple[Tensor, int]],
    minutes: float,
    lr: float,
    progress: Callable[[int], None] | None,
) -> tuple[int, int, float]:
    """Train ``draft`` for ``minutes`` (Adam, its rate rising linearly over the first :data:`WARMUP`
    steps, Adam's noisiest, then constant at ``lr``; gradients clipped at 1): each step's ``lesson()``
    gives its loss and how many sources (prompts) it learnt from, which ``progress`` hears. Returns
    the steps, the sources and the seconds; the draft is left in eval mode."""
    optimizer = torch.optim.Adam(draft.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = make_scheduler(optimizer, lambda step: constant(step, lr, WARMUP))
    began, steps, sources = time.perf_counter(), 0, 0
    while time.perf_counter() - began < minutes * 60:
        draft.train()
        loss, count = lesson()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        steps, sources = steps + 1, sources + count
        if progress is not None:
            progress(count)
    draft.eval()
    return steps, sources, time.perf_counter() - began


def _endless(sources: list[list[int]], size: int, rng: random.Random) -> Iterator[list[list[int]]]:
    """:func:`_batches` of ``sources``, epoch after epoch."""
    if not sources:
        raise ValueError("no sources to learn a draft from")
    while True:
        yield from _batches(sources, size, rng)


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


def distill_causal_draft(
    model: DecoderModel,
    text: list[int],
    specials: SpecialIds,
    *,
    minutes: float,
    batch_size: int = 64,
    lr: float = 5e-4,
    seed: int = 1,
    progress: Callable[[int], None] | None = None,
    temperature: float = 0.0,
) -> Distilled:
    """A draft for the GPT ``model`` (float32, as trained), taught for ``minutes`` on prompts cut at random
    from the tokens ``text`` (the first nine tenths; :data:`HELD_OUT` prompts of the last tenth, or fewer,
    measure its agreement), each of half the model's context, continued greedily by the model for the
    other half. ``progress`` hears how many prompts each step learnt from. With ``temperature`` > 0, a
    draft for speculative sampling at that temperature (module docstring): the continuations are the
    model's samples, the draft learns its distributions, and its agreement is the expected acceptance."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    context = model.config.max_len
    length = max(1, context // 2)  # a prompt's tokens; the continuation fills the rest of the context
    split = len(text) * 9 // 10
    if split < length + 1:
        raise ValueError(f"a text of {len(text)} tokens is too short for prompts of {length}")
    held_starts = [rng.randrange(split, max(split + 1, len(text) - length)) for _ in range(HELD_OUT)]
    held = [text[i : i + length] for i in held_starts if len(text[i : i + length]) == length]
    model.eval().requires_grad_(False)
    draft = ShallowCausalDraft(model)
    sampling = torch.Generator().manual_seed(seed) if temperature > 0 else None  # the continuations' draws
    held_out = _continued(model, held, specials, context, temperature, sampling) if held else None
    before = causal_agreement(draft, held_out, temperature) if held_out else (0.0, 0)

    def lesson() -> tuple[Tensor, int]:
        starts = [rng.randrange(0, split - length + 1) for _ in range(batch_size)]
        prompts = [text[i : i + length] for i in starts]
        continued = _continued(model, prompts, specials, context, temperature, sampling)
        logits = draft(continued.sequences)  # (B, T, V)
        if temperature > 0:
            return kl_loss(logits, continued.targets(temperature), continued.real, temperature), batch_size
        return _loss(logits, continued.targets(), -1, log_probs=False), batch_size  # (-1: padding)

    steps, prompts, seconds = _learn(draft, lesson, minutes, lr, progress)
    after = causal_agreement(draft, held_out, temperature) if held_out else (0.0, 0)
    return Distilled(draft, before[0], after[0], after[1], prompts, steps, seconds)


@dataclass
class Continued:
    """Prompts followed by the model's continuations, ``sequences (B, T)`` (right-padded after a
    continuation that ended), with the model's logits at every position ``(B, T, V)``, which positions
    are ``real`` tokens and which predict the ``continuing`` text (from each prompt's last token on)."""

    sequences: Tensor
    logits: Tensor
    real: Tensor
    continuing: Tensor

    def targets(self, temperature: float = 0.0) -> Tensor:
        """What the draft learns: the model's most probable next token at each position, ``-1`` at the
        padding ``(B, T)``; with ``temperature`` > 0, the distribution sampling draws from there,
        ``softmax(logits / temperature)`` ``(B, T, V)``."""
        if temperature > 0:
            return distribution(self.logits.log_softmax(-1), temperature)  # (B, T, V)
        return self.logits.argmax(-1).masked_fill(~self.real, -1)


@torch.no_grad()
def _continued(
    model: DecoderModel,
    prompts: list[list[int]],
    specials: SpecialIds,
    context: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> Continued:
    """``prompts`` (as many tokens each) followed by the model's continuations to fill the ``context``:
    greedy, or with ``temperature`` > 0 drawn from ``generator`` at that temperature."""
    tokens = torch.tensor(prompts)  # (B, P)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    limits = torch.full((len(prompts),), context - tokens.size(1))
    every = [generator or torch.Generator()] * len(prompts)  # (one generator, its draws in turn)
    choose = argmax if temperature == 0 else sampler(every, temperature)
    continuations = extend(model.decoding(valid), tokens, limits, specials, choose)
    sequences = pad([p + c for p, c in zip(prompts, continuations, strict=True)], specials.pad)  # (B, T)
    lengths = torch.tensor([len(p) + len(c) for p, c in zip(prompts, continuations, strict=True)])
    real = torch.arange(sequences.size(1))[None, :] < lengths[:, None]  # (B, T)
    continuing = real.clone()
    continuing[:, : tokens.size(1) - 1] = False  # from the prompt's last token on
    return Continued(sequences, model(sequences), real, continuing)  # right-padded, so no mask


def kl_loss(logits: Tensor, target: Tensor, real: Tensor, temperature: float) -> Tensor:
    """KL(p ‖ q) averaged over the ``real (B, T)`` positions: ``p`` the model's distributions ``target
    (B, T, V)``, ``q = softmax(logits / temperature)`` the draft's at the same temperature."""
    log_q = (logits / temperature).log_softmax(-1)  # (B, T, V)
    divergence = F.kl_div(log_q, target, reduction="none").sum(-1)  # (B, T): Σ_v p (log p − log q)
    return divergence[real].mean()


@torch.no_grad()
def causal_agreement(
    draft: ShallowCausalDraft, continued: Continued, temperature: float = 0.0
) -> tuple[float, int]:
    """The share of the positions that predict the model's continuations where the draft's most probable
    next token is the model's; with ``temperature`` > 0, the expected acceptance there, the mean of
    Σ_v min(p_v, q_v) (p the model's sampling distribution, q the draft's). And how many positions."""
    draft.eval()
    logits, continuing = draft(continued.sequences), continued.continuing  # (B, T, V), (B, T)
    count = int(continuing.sum())
    if temperature > 0:
        drafted = distribution(logits.log_softmax(-1), temperature)  # (B, T, V)
        kept = torch.minimum(continued.targets(temperature), drafted).sum(-1)  # (B, T)
        return float(kept[continuing].sum()) / max(count, 1), count
    guesses = logits.argmax(-1)  # (B, T)
    return float((guesses.eq(continued.targets()) & continuing).sum()) / max(count, 1), count
