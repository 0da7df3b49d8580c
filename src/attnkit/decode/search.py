"""Batched greedy and beam search over an EncoderDecoder, with the KV cache (or without, to check it).

Output length is bounded per sentence by ``max_len_a · source_length + max_len_b`` tokens including
``</s>`` (fairseq's rule), and never more than ``max_output_len`` (what the model supports, e.g. its
learned positions); at the bound ``</s>`` is the only choice left, in greedy and beam search alike.
The special ids (padding, decoder start, end) come from the tokenizer's :class:`SpecialIds`.

Beam search ranks finished hypotheses by ``log P(Y|X) / lp(Y)`` with the GNMT length penalty
(Wu et al., 2016, eq. 14): ``lp(Y) = ((5 + |Y|) / 6) ** alpha``, where ``|Y|`` counts the generated
tokens including ``</s>``; ``alpha = 0`` ranks by plain log-probability. A sentence is done when it has
``beam_size`` finished hypotheses (fairseq's stopping rule), or at its length bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.attention.masks import padding_mask
from attnkit.data.tokenizer import SpecialIds
from attnkit.models.seq2seq import EncoderDecoder
from attnkit.nn.transformer import DecoderCache


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, without <s> and </s>
    score: float  # length-normalised log-probability


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ``((5 + |Y|) / 6) ** alpha``."""
    return ((5 + length) / 6) ** alpha


def _limits(src: Tensor, pad_id: int, max_len_a: float, max_len_b: int, max_output_len: int | None) -> Tensor:
    src_lengths = (src != pad_id).sum(-1)
    limits = (max_len_a * src_lengths + max_len_b).long()
    return limits.clamp(min=1, max=max_output_len)  # (B,)


def _next_log_probs(
    model, memory, src_mask, tokens: Tensor, cache: DecoderCache | None, at_limit: Tensor, ids: SpecialIds
) -> Tensor:
    """Log-probabilities of the next token after ``tokens (N, t)``: ``(N, V)``.

    ``<pad>`` and ``<s>`` are never generated; rows ``at_limit`` may only end (``</s>``), keeping the
    model's probability of ending so that scores stay true log-probabilities.
    """
    step = tokens[:, -1:] if cache is not None else tokens
    hidden = model.decode(memory, src_mask, step, cache=cache)[:, -1]
    log_probs = model.generator(hidden).float().log_softmax(-1)
    log_probs[:, ids.pad] = log_probs[:, ids.bos] = float("-inf")
    end = log_probs[:, ids.eos].clone()
    log_probs[at_limit] = float("-inf")
    log_probs[:, ids.eos] = end
    return log_probs


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
    src_mask = padding_mask(src, specials.pad)
    memory = model.encode(src, src_mask)
    cache = model.new_cache() if use_cache else None
    limits = _limits(src, specials.pad, max_len_a, max_len_b, max_output_len)
    tokens = torch.full((src.size(0), 1), specials.bos, dtype=torch.long, device=src.device)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for t in range(int(limits.max())):
        log_probs = _next_log_probs(model, memory, src_mask, tokens, cache, t + 1 >= limits, specials)
        next_token = torch.where(finished, specials.pad, log_probs.argmax(-1))
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == specials.eos
        if finished.all():
            break
    return [_strip(row, specials) for row in tokens[:, 1:].tolist()]


def _strip(ids: list[int], specials: SpecialIds) -> list[int]:
    if specials.eos in ids:
        return ids[: ids.index(specials.eos)]
    return [i for i in ids if i != specials.pad]


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
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size ({beam_size}), got {n_best}")
    B, K, device = src.size(0), beam_size, src.device
    src_mask = padding_mask(src, specials.pad).repeat_interleave(K, dim=0)  # (B·K, 1, S)
    memory = model.encode(src.repeat_interleave(K, dim=0), src_mask)  # (B·K, S, d_model)
    cache = model.new_cache() if use_cache else None
    limits = _limits(src, specials.pad, max_len_a, max_len_b, max_output_len)
    row_limits = limits.repeat_interleave(K)  # (B·K,)
    tokens = torch.full((B * K, 1), specials.bos, dtype=torch.long, device=device)
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one so the first step does not pick duplicates
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    for t in range(int(limits.max())):
        at_limit = t + 1 >= row_limits
        log_probs = _next_log_probs(model, memory, src_mask, tokens, cache, at_limit, specials)  # (B·K, V)
        V = log_probs.size(-1)
        candidates = (scores.view(-1, 1) + log_probs).view(B, K * V)
        top_scores, top_index = candidates.topk(min(2 * K, K * V), dim=-1)  # 2K: K may end in </s>
        keep_rows, keep_tokens, keep_scores = [], [], []
        for b in range(B):
            rows, next_tokens, next_scores = _advance_sentence(
                b, t, K, V, top_scores[b].tolist(), top_index[b].tolist(), tokens, alpha, finished, specials
            )
            keep_rows += rows
            keep_tokens += next_tokens
            keep_scores += next_scores
        if all(len(f) >= K for f in finished):
            break
        index = torch.tensor(keep_rows, device=device)
        tokens = torch.cat([tokens[index], torch.tensor(keep_tokens, device=device)[:, None]], dim=1)
        scores = torch.tensor(keep_scores, device=device).view(B, K)
        if cache is not None:
            cache.reorder(index)
    return [sorted(f, key=lambda h: -h.score)[:n_best] for f in finished]


def _advance_sentence(b, t, K, V, top_scores, top_index, tokens, alpha, finished, specials):
    """Move sentence ``b``'s candidates into finished hypotheses or the K beams of the next step."""
    rows, next_tokens, next_scores = [], [], []
    done = len(finished[b]) >= K
    for score, flat in zip(top_scores, top_index, strict=True):
        if done or len(rows) == K or score == float("-inf"):
            break
        beam, token = divmod(flat, V)
        row = b * K + beam
        if token == specials.eos:
            finished[b].append(Hypothesis(tokens[row, 1:].tolist(), score / length_penalty(t + 1, alpha)))
            done = len(finished[b]) >= K
        else:
            rows.append(row)
            next_tokens.append(token)
            next_scores.append(score)
    while len(rows) < K:  # a finished sentence (or too few candidates) keeps dead beams in place
        rows.append(b * K)
        next_tokens.append(specials.pad)
        next_scores.append(float("-inf"))
    return rows, next_tokens, next_scores
