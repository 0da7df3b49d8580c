"""Search, written once for every generative model: greedy, sampling and beam search.

A model offers step-by-step decoding through a small object (:class:`Decoding`): ``next_logits(tokens)``
gives the logits of the next token after all tokens so far (a model with a KV cache runs only the new
ones) and ``reorder(index)`` keeps the given rows. ``EncoderDecoder.decoding(src)`` and
``DecoderModel.decoding(prompt_valid)`` make one; :func:`greedy` and :func:`beam_search` below are the
encoder-decoder's entry points, ``decode/generate.py`` the decoder-only model's.

Output length is bounded per row (``limits``, in generated tokens including ``</s>``): for translation
``max_len_a · source_length + max_len_b`` (fairseq's rule), never more than ``max_output_len`` (what the
model supports, e.g. its learned positions). At the bound ``</s>`` is the only choice left, in every
search alike, and ``<pad>`` and ``<s>`` are never generated (unless one of them is also ``</s>``, as
GPT-2's ``<|endoftext|>`` is). The special ids come from the tokenizer's :class:`SpecialIds`.

Beam search ranks finished hypotheses by ``log P(Y|X) / lp(Y)`` with the GNMT length penalty
(Wu et al., 2016, eq. 14): ``lp(Y) = ((5 + |Y|) / 6) ** alpha``, where ``|Y|`` counts the generated
tokens including ``</s>``; ``alpha = 0`` ranks by plain log-probability. A row is done when it has
``beam_size`` finished hypotheses (fairseq's stopping rule), or at its length bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from attnkit.data.tokenizer import SpecialIds
from attnkit.models.seq2seq import EncoderDecoder

Choose = Callable[[Tensor], Tensor]  # log-probabilities (N, V) -> the next token of each row (N,)


class Decoding(Protocol):
    """Step-by-step decoding, as a generative model offers it (see the module docstring); a
    sequence-to-sequence model's also offers ``repeat(k)`` (each row becomes k beams, encoded once)."""

    def next_logits(self, tokens: Tensor) -> Tensor: ...

    def reorder(self, index: Tensor) -> None: ...


@contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` in eval mode (no dropout) inside the block, back in its former mode after it."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, without the prefix (<s> or the prompt) and without </s>
    score: float  # length-normalised log-probability


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ``((5 + |Y|) / 6) ** alpha``."""
    return ((5 + length) / 6) ** alpha


def next_log_probs(decoding: Decoding, tokens: Tensor, at_limit: Tensor, specials: SpecialIds) -> Tensor:
    """Log-probabilities of the next token after ``tokens (N, t)``: ``(N, V)``, in float32 at least.

    ``<pad>`` and ``<s>`` are never generated; rows ``at_limit`` may only end (``</s>``), keeping the
    model's probability of ending so that scores stay true log-probabilities.
    """
    logits = decoding.next_logits(tokens)
    log_probs = logits.log_softmax(-1, dtype=torch.promote_types(logits.dtype, torch.float32))
    for banned in {specials.pad, specials.bos} - {specials.eos}:
        log_probs[:, banned] = float("-inf")
    end = log_probs[:, specials.eos].clone()
    log_probs[at_limit] = float("-inf")
    log_probs[:, specials.eos] = end
    return log_probs


def extend(
    decoding: Decoding,
    tokens: Tensor,
    limits: Tensor,
    specials: SpecialIds,
    choose: Choose,
    observe: Callable[[Tensor], Tensor | None] | None = None,
) -> list[list[int]]:
    """Append one token per step to every row of ``tokens (N, t)`` (``<s>``, or a prompt) until it has
    ended or reached its limit; returns the generated ids of each row, without ``</s>``.

    ``choose`` picks each row's next token (argmax for greedy search, or a sampler); ``observe``, if
    given, sees the generated tokens ``(N, steps)`` after every step (to stream them) and may return a
    mask of rows to end there (stop strings).
    """
    start = tokens.size(1)
    finished = torch.zeros(tokens.size(0), dtype=torch.bool, device=tokens.device)
    for t in range(int(limits.max()) if len(limits) else 0):
        log_probs = next_log_probs(decoding, tokens, t + 1 >= limits, specials)
        next_token = torch.where(finished, specials.pad, choose(log_probs))
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == specials.eos
        stop = observe(tokens[:, start:]) if observe is not None else None
        if stop is not None:
            finished |= stop
        if finished.all():
            break
    return [_strip(row, specials) for row in tokens[:, start:].tolist()]


def _strip(ids: list[int], specials: SpecialIds) -> list[int]:
    if specials.eos in ids:
        return ids[: ids.index(specials.eos)]
    return [i for i in ids if i != specials.pad]


def argmax(log_probs: Tensor) -> Tensor:
    """Greedy choice: the most probable token of each row."""
    return log_probs.argmax(-1)


def sampler(
    generators: list[torch.Generator], temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> Choose:
    """Sampling from ``softmax(log p / temperature)``, restricted to the ``top_k`` most probable tokens
    (0 = all) and to the smallest set whose probability reaches ``top_p`` (Holtzman et al., 2020;
    1.0 = all). Row ``i`` draws from ``generators[i]``, so its text does not depend on the other rows.
    ``temperature = 0`` is greedy."""

    def choose(log_probs: Tensor) -> Tensor:
        if temperature == 0:
            return argmax(log_probs)
        probs = restrict(log_probs / temperature, top_k, top_p).softmax(-1)  # (N, V)
        picks = [torch.multinomial(row, 1, generator=g) for row, g in zip(probs, generators, strict=True)]
        return torch.cat(picks)

    return choose


def restrict(scores: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """``scores (N, V)`` with everything outside the top-k / top-p set set to ``-inf``."""
    if 0 < top_k < scores.size(-1):
        kth = scores.topk(top_k, dim=-1).values[:, -1:]  # (N, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = scores.sort(dim=-1, descending=True)
        probs = ordered.softmax(-1)
        before = probs.cumsum(-1) - probs  # probability of the more likely tokens
        drop = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, order, before >= top_p)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def beam(
    decoding: Decoding,
    tokens: Tensor,
    limits: Tensor,
    specials: SpecialIds,
    beam_size: int,
    alpha: float = 0.6,
    n_best: int = 1,
) -> list[list[Hypothesis]]:
    """Beam search after ``tokens (B·K, t)``, each row's prefix repeated ``K = beam_size`` times
    (``decoding`` made for those B·K rows); the ``n_best`` best hypotheses per row, best first.

    Each step takes every row's 2K best candidates (K beams × V tokens; 2K because up to K may end in
    ``</s>``). In score order, a candidate ending in ``</s>`` becomes a finished hypothesis while fewer
    than K others came before it and its row still needs some; the first K others are the next beams.
    This is done on tensors for all rows at once, with one read-back per step (the finished ones).
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size ({beam_size}), got {n_best}")
    K, start, device = beam_size, tokens.size(1), tokens.device
    B = tokens.size(0) // K
    row_limits = limits.repeat_interleave(K)  # (B·K,)
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one so the first step does not pick duplicates
    first_beam = torch.arange(B, device=device)[:, None] * K  # (B, 1): row of each source's beam 0
    position = torch.arange(2 * K, device=device)  # a candidate's rank in its row
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    for t in range(int(limits.max()) if B else 0):
        log_probs = next_log_probs(decoding, tokens, t + 1 >= row_limits, specials)  # (B·K, V)
        V = log_probs.size(-1)
        candidates = (scores.view(-1, 1) + log_probs).view(B, K * V)
        top_scores, top_index = candidates.topk(min(2 * K, K * V), dim=-1)  # (B, 2K) each, best first
        rows, words = first_beam + top_index // V, top_index % V  # the beam row and token of each
        needed = torch.tensor([K - len(f) for f in finished], device=device)[:, None]  # (B, 1)
        alive = (top_scores > float("-inf")) & (needed > 0)
        ends, goes_on = alive & (words == specials.eos), alive & (words != specials.eos)
        others_before = goes_on.cumsum(-1) - goes_on.long()  # candidates that go on, ranked higher
        ends &= (others_before < K) & (ends.cumsum(-1) <= needed)
        for b, p in ends.nonzero().tolist():
            hypothesis = tokens[rows[b, p], start:].tolist()
            finished[b].append(Hypothesis(hypothesis, top_scores[b, p].item() / length_penalty(t + 1, alpha)))
        if all(len(f) >= K for f in finished):
            break
        # The next beams: the first K candidates that go on, in score order; too few: dead beams.
        order = torch.where(goes_on, position[: top_index.size(1)], 2 * K + position[: top_index.size(1)])
        chosen = order.argsort(-1)[:, :K]  # (B, K)
        real = goes_on.gather(-1, chosen)
        index = torch.where(real, rows.gather(-1, chosen), first_beam).view(-1)  # (B·K,)
        next_tokens = torch.where(real, words.gather(-1, chosen), specials.pad).view(-1, 1)
        scores = torch.where(real, top_scores.gather(-1, chosen), float("-inf"))
        tokens = torch.cat([tokens[index], next_tokens], dim=1)
        decoding.reorder(index)
    return [sorted(f, key=lambda h: -h.score)[:n_best] for f in finished]


# --- the encoder-decoder's entry points ------------------------------------------------------------


def _limits(src: Tensor, pad_id: int, max_len_a: float, max_len_b: int, max_output_len: int | None) -> Tensor:
    src_lengths = (src != pad_id).sum(-1)
    limits = (max_len_a * src_lengths + max_len_b).long()
    return limits.clamp(min=1, max=max_output_len)  # (B,)


@torch.no_grad()
def greedy(
    model: EncoderDecoder,
    src: Tensor,
    specials: SpecialIds,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    *,
    max_output_len: int | None = None,
    use_cache: bool = True,
) -> list[list[int]]:
    """The most probable next token at every step, for a batch of sources ``(B, S)``."""
    limits = _limits(src, specials.pad, max_len_a, max_len_b, max_output_len)
    start = torch.full((src.size(0), 1), specials.bos, dtype=torch.long, device=src.device)
    return extend(model.decoding(src, use_cache), start, limits, specials, argmax)


@torch.no_grad()
def beam_search(
    model: EncoderDecoder,
    src: Tensor,
    specials: SpecialIds,
    beam_size: int = 5,
    alpha: float = 0.6,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    n_best: int = 1,
    *,
    max_output_len: int | None = None,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """The ``n_best`` best hypotheses per source (fewer if fewer finished), best first."""
    limits = _limits(src, specials.pad, max_len_a, max_len_b, max_output_len)
    decoding = model.decoding(src, use_cache)  # encoded once,
    decoding.repeat(beam_size)  # then B·K rows
    start = torch.full((src.size(0) * beam_size, 1), specials.bos, dtype=torch.long, device=src.device)
    return beam(decoding, start, limits, specials, beam_size, alpha, n_best)
