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
    """Step-by-step decoding, as a generative model offers it (see the module docstring)."""

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
    (``decoding`` made for those B·K rows); the ``n_best`` best hypotheses per row, best first."""
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size ({beam_size}), got {n_best}")
    K, start, device = beam_size, tokens.size(1), tokens.device
    B = tokens.size(0) // K
    row_limits = limits.repeat_interleave(K)  # (B·K,)
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one so the first step does not pick duplicates
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    for t in range(int(limits.max()) if B else 0):
        log_probs = next_log_probs(decoding, tokens, t + 1 >= row_limits, specials)  # (B·K, V)
        V = log_probs.size(-1)
        candidates = (scores.view(-1, 1) + log_probs).view(B, K * V)
        top_scores, top_index = candidates.topk(min(2 * K, K * V), dim=-1)  # 2K: K may end in </s>
        keep_rows, keep_tokens, keep_scores = [], [], []
        for b in range(B):
            rows, next_tokens, next_scores = _advance_row(
                b, t, K, V, top_scores[b].tolist(), top_index[b].tolist(), tokens[:, start:], alpha,
                finished, specials,
            )  # fmt: skip
            keep_rows += rows
            keep_tokens += next_tokens
            keep_scores += next_scores
        if all(len(f) >= K for f in finished):
            break
        index = torch.tensor(keep_rows, device=device)
        tokens = torch.cat([tokens[index], torch.tensor(keep_tokens, device=device)[:, None]], dim=1)
        scores = torch.tensor(keep_scores, device=device).view(B, K)
        decoding.reorder(index)
    return [sorted(f, key=lambda h: -h.score)[:n_best] for f in finished]


def _advance_row(b, t, K, V, top_scores, top_index, generated, alpha, finished, specials):
    """Move row ``b``'s candidates into finished hypotheses or the K beams of the next step."""
    rows, next_tokens, next_scores = [], [], []
    done = len(finished[b]) >= K
    for score, flat in zip(top_scores, top_index, strict=True):
        if done or len(rows) == K or score == float("-inf"):
            break
        beam_index, token = divmod(flat, V)
        row = b * K + beam_index
        if token == specials.eos:
            hypothesis = Hypothesis(generated[row].tolist(), score / length_penalty(t + 1, alpha))
            finished[b].append(hypothesis)
            done = len(finished[b]) >= K
        else:
            rows.append(row)
            next_tokens.append(token)
            next_scores.append(score)
    while len(rows) < K:  # a finished row (or too few candidates) keeps dead beams in place
        rows.append(b * K)
        next_tokens.append(specials.pad)
        next_scores.append(float("-inf"))
    return rows, next_tokens, next_scores


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
    decoding = model.decoding(src.repeat_interleave(beam_size, dim=0), use_cache)  # B·K rows
    start = torch.full((src.size(0) * beam_size, 1), specials.bos, dtype=torch.long, device=src.device)
    return beam(decoding, start, limits, specials, beam_size, alpha, n_best)
