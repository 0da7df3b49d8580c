"""The RNN decoder's attention over the source: global or local, soft or hard.

One query (the decoder state) a step against the same source annotations ``h_j``:

- **global, soft** (Bahdanau et al., 2015; Luong et al., 2015, §3.1): ``α = softmax(score(q, h))`` over
  every source token, ``c = Σ_j α_j h_j``.
- **local-m** (Luong §3.2): only ``j ∈ [p_t - D, p_t + D]`` with ``p_t = t``, the target step, assuming
  roughly monotonic alignments. Where the target runs longer than the source, ``p_t`` stops at the last
  source token (Luong leave this case open; without it those steps would see no source at all).
- **local-p** (Luong §3.2, eq. 9–10): a predicted centre ``p_t = S · sigmoid(v_pᵀ tanh(W_p q))`` (``S``
  the source length), and ``α_j = softmax(score)_j · exp(-(j - p_t)² / 2σ²)`` with ``σ = D/2``: the
  Gaussian makes ``p_t`` differentiable, and the weights then sum to *at most* one, as in the paper.
- **hard** (Xu et al., 2015, §4.1, "stochastic hard attention"): while training, sample one position
  ``s ~ α`` (renormalised) and take ``c = h_s``; the choice is trained by REINFORCE (``nn/reinforce.py``)
  with the log-likelihood of each step's token as reward, a moving-average baseline and an entropy
  bonus (Xu et al. eq. 12). As Xu et al. do to lower the variance, a share of the training sentences
  (``expected``, their 0.5) takes the expected context ``Σ_j α_j h_j`` at every step instead of a sample:
  α then also learns by backpropagation, as soft attention does, and REINFORCE trains the sampled rest
  (the entropy bonus, too, is for sampled sentences only). The first ``soft_batches`` training batches
  take the expected context throughout: α learns alignments by backpropagation before anything is
  sampled from it (from a uniform α, samples are noise the decoder learns to ignore, and then no choice
  earns more reward than another).
  When decoding, take the most likely position (argmax): the decoder must work from single annotations,
  the case it was trained on whenever it sampled; without the expected-context share (``expected: 0``) it
  never saw a blend at all.

- **median** (Bahdanau et al., 2016, "End-to-end attention-based large vocabulary speech recognition",
  §3.2, "windowing"): only ``j ∈ [m - D, m + D]`` around the median ``m`` of the previous step's
  weights, in training as in decoding: an alignment that moves forward a little each step, as speech
  does, cannot jump to a place far from where it was (nor settle on the utterance's final silence).
- **location-aware** (Chorowski et al., 2015, score ``location``): Bahdanau's additive score plus
  features of the previous step's weights, convolved (``LocationAware``). Before the first step the
  previous weights are all on the first position (an utterance is read from its start). The source
  carries each row's last weights (``Source.previous``) from step to step, so the search's reordering of
  beams keeps each beam's own.

Scores come from ``attnkit.attention.scores`` (the key side projected once per sentence) and weights
from its ``softmax`` with the padding mask and window, so masked positions get exactly zero weight.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.attention.invariance import cut_or_padded, key_groups
from attnkit.attention.masks import keys_near
from attnkit.attention.normalisers import softmax
from attnkit.attention.scores import (
    BahdanauAdditive,
    LocationAware,
    LuongConcat,
    LuongGeneral,
    dot,
    split_score,
)


@dataclass
class Source:
    """The encoded source a decoder attends to, one row per sentence (or beam)."""

    annotations: Tensor  # (B, S, d_hidden): h_j
    keys: Tensor  # (B, S, d): the score's key side, computed once per sentence
    mask: Tensor  # (B, 1, S): real tokens
    length: Tensor  # (B, 1, 1): how many, as a float (local attention's S)
    expected: Tensor | None = None  # (B, 1, 1) bool, hard attention while training: these rows take Σ α h
    previous: Tensor | None = None  # (B, S): location-aware attention: the weights of the step before

    def select(self, index: Tensor) -> Source:
        """The given rows (the search's reordering of beams)."""
        pick = lambda value: None if value is None else value[index]  # noqa: E731
        return Source(*(pick(getattr(self, f.name)) for f in fields(self)))


@dataclass
class Alignment:
    """What one step attended to."""

    weights: Tensor  # (B, S): α_t, zero on padding and outside a local window
    log_prob: Tensor | None = None  # hard attention: log-probability of the sampled position (B,)
    entropy: Tensor | None = None  # hard attention: entropy of the distribution it was drawn from (B,)


def _cut(value: Tensor | None, rows: Tensor | slice, length: int, field: str) -> Tensor | None:
    """``rows`` of a :class:`Source`'s ``field``, its positions cut or padded to ``length``."""
    if value is None:
        return None
    dim = {"annotations": 1, "keys": 1, "mask": -1, "previous": -1}.get(field)
    return value[rows] if dim is None else cut_or_padded(value[rows], length, dim)


def make_source(annotations: Tensor, mask: Tensor, project_keys: Any = None) -> Source:
    """The source for annotations ``(B, S, d_hidden)`` whose real positions are ``mask (B, 1, S)`` (a
    sentence's tokens: ``padding_mask(src, pad_id)``; an image's regions: all); keys projected if asked."""
    length = mask.sum(-1, keepdim=True).clamp(min=1).to(annotations.dtype)  # (B, 1, 1)
    return Source(annotations, project_keys(annotations) if project_keys else annotations, mask, length)


def make_score(name: str, d: int) -> Any:
    """The score module (or function) called ``name`` for queries and keys ``d`` wide."""
    return {"bahdanau": lambda: BahdanauAdditive(d, d), "dot": lambda: dot,
            "general": lambda: LuongGeneral(d, d), "concat": lambda: LuongConcat(d, d),
            "location": lambda: LocationAware(d, d)}[name]()  # fmt: skip


class SourceAttention(nn.Module):
    """``prepare(annotations, src)`` once per batch, then ``forward(query, t, source)`` each step;
    ``expected``: hard attention's share of training sentences given the expected context instead."""

    def __init__(self, score: str, d_hidden: int, local: str = "none", window: int = 10, hard: bool = False,
                 expected: float = 0.0, soft_batches: int = 0):  # fmt: skip
        super().__init__()
        self.score, self.local, self.window, self.hard = make_score(score, d_hidden), local, window, hard
        self.expected, self.soft_batches = expected, soft_batches
        if hard:  # training batches seen, so that the first soft_batches are soft (saved: resumes exactly)
            self.register_buffer("batches", torch.zeros((), dtype=torch.long))
        if local == "local-p":  # p_t = S · sigmoid(v_pᵀ tanh(W_p h_t))
            self.W_p = nn.Linear(d_hidden, d_hidden, bias=False)
            self.v_p = nn.Linear(d_hidden, 1, bias=False)

    def prepare(self, annotations: Tensor, mask: Tensor) -> Source:
        """What the steps attend to: ``annotations (B, S, d_hidden)`` at the real positions ``mask
        (B, 1, S)``, the keys projected once."""
        project_keys, _ = split_score(self.score)
        source = make_source(annotations, mask, project_keys)
        if isinstance(self.score, LocationAware) or self.local == "median":  # α_0: on the first position
            source.previous = torch.zeros_like(mask.squeeze(1), dtype=annotations.dtype)  # (B, S)
            source.previous[:, 0] = 1
        if self.hard and self.training:
            self.batches += 1
            share = 1.0 if self.batches <= self.soft_batches else self.expected  # a soft start, then Xu's
            if share > 0:  # per sentence, with probability ``share``
                rows = annotations.size(0)
                source.expected = torch.rand(rows, 1, 1, device=annotations.device) < share
        return source

    def forward(self, query: Tensor, t: int, source: Source) -> tuple[Tensor, Alignment]:
        """The context ``(B, 1, d_hidden)`` for a query ``(B, 1, d_hidden)`` at target step ``t``; in
        inference, each row's what it is alone (:meth:`_as_alone`)."""
        if torch.is_grad_enabled() or self.training:
            return self._attend(query, t, source)
        return self._as_alone(query, t, source)

    def _as_alone(self, query: Tensor, t: int, source: Source) -> tuple[Tensor, Alignment]:
        """:meth:`_attend` for each group of rows whose real annotations, padded to a multiple of
        ``KEY_BUCKET``, are as long (``attnkit.attention.invariance``): a row's softmax and context
        then sum over the same positions in the same order whatever its batchmates' lengths, so that a
        sentence's output does not depend on its batch (docs/invariance.md)."""
        S = source.mask.size(-1)
        row_groups = list(key_groups(source.mask))
        if len(row_groups) == 1 and row_groups[0][0] == S:  # every row padded to its own width already
            return self._attend(query, t, source)
        contexts = query.new_empty(query.size(0), 1, source.annotations.size(-1))  # (B, 1, d_hidden)
        weights = query.new_zeros(query.size(0), S)  # (B, S)
        for length, rows in row_groups:
            part = Source(*(_cut(getattr(source, f.name), rows, length, f.name) for f in fields(Source)))
            contexts[rows], alignment = self._attend(query[rows], t, part)
            weights[rows] = cut_or_padded(alignment.weights, S, -1)
            if source.previous is not None:  # what the next step's location features read
                source.previous[rows] = cut_or_padded(part.previous, S, -1)
        return contexts, Alignment(weights)

    def _attend(self, query: Tensor, t: int, source: Source) -> tuple[Tensor, Alignment]:
        """The context ``(B, 1, d_hidden)`` and weights of every row of ``source`` together."""
        if isinstance(self.score, LocationAware):
            scores = self.score.match(query, source.keys, source.previous)  # (B, 1, S)
        else:
            scores = split_score(self.score)[1](query, source.keys)  # (B, 1, S)
        mask = source.mask  # (B, 1, S)
        if self.hard:  # a policy's probabilities in float32 (or 64), also under bf16 autocast: log p is
            scores = scores.to(torch.promote_types(scores.dtype, torch.float32))  # REINFORCE's gradient
        if self.local != "none":
            centre = self.centre(query, t, source)  # (B, 1, 1)
            mask = mask & keys_near(centre, scores.size(-1), self.window)
        weights = softmax(scores, mask)  # (B, 1, S)
        if self.local == "local-p":  # prefer positions near p_t: a Gaussian with σ = D/2 (Luong eq. 10)
            distance = torch.arange(scores.size(-1), device=scores.device) - centre  # (B, 1, S)
            weights = weights * torch.exp(-distance.square() / (2 * (self.window / 2) ** 2))
        if source.previous is not None:  # what the next step's location features read
            source.previous = weights.squeeze(1)
        if self.hard:
            return self._sample(weights.squeeze(1), source)
        return weights @ source.annotations, Alignment(weights.squeeze(1))

    def centre(self, query: Tensor, t: int, source: Source) -> Tensor:
        """``p_t`` of the local window, ``(B, 1, 1)``: the step (local-m), a prediction (local-p), or the
        median of the previous step's weights (median)."""
        if self.local == "local-m":
            return (source.length - 1).clamp(max=t)
        if self.local == "median":  # the first position where the previous weights add up to one half
            assert source.previous is not None
            return (source.previous.cumsum(-1) < 0.5).sum(-1).view(-1, 1, 1).to(source.length.dtype)
        return source.length * torch.sigmoid(self.v_p(torch.tanh(self.W_p(query))))

    def _sample(self, weights: Tensor, source: Source) -> tuple[Tensor, Alignment]:
        """Hard attention: one position, sampled from ``weights (B, S)`` while training, else the argmax;
        the rows ``source.expected`` marks take the expectation instead (their ``log_prob`` is zero, so
        REINFORCE leaves them to backpropagation)."""
        annotations = source.annotations
        p = weights / weights.sum(-1, keepdim=True)  # local-p's weights sum to less than one
        choice = torch.multinomial(p, 1) if self.training else p.argmax(-1, keepdim=True)  # (B, 1)
        picked = annotations.gather(1, choice.unsqueeze(-1).expand(-1, -1, annotations.size(-1)))  # (B, 1, d)
        log_prob = p.gather(-1, choice).squeeze(-1).log()
        log_p = p.clamp(min=torch.finfo(p.dtype).tiny).log()  # finite where p = 0 (xlogy's gradient is not)
        entropy = -(p * log_p).sum(-1)
        if self.training and source.expected is not None:  # nothing sampled there: no REINFORCE, no bonus
            picked = torch.where(source.expected, p.unsqueeze(1) @ annotations, picked)  # (B, 1, d)
            log_prob = log_prob.masked_fill(source.expected.view(-1), 0.0)
            entropy = entropy.masked_fill(source.expected.view(-1), 0.0)
        return picked, Alignment(p, log_prob, entropy)
