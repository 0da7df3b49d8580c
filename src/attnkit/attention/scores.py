"""Attention scores: how well each query matches each key.

A score function maps queries ``q (..., T_q, d_q)`` and keys ``k (..., T_k, d_k)`` to raw scores
``(..., T_q, T_k)``; a normaliser (normalisers.py) then turns them into weights.

- ``dot`` and ``scaled_dot`` have no parameters and are plain functions, chosen by name.
- Luong ``general`` and ``concat`` (Luong et al., 2015, §3.1) and Bahdanau ``additive`` (Bahdanau et al.,
  2015, appendix A.1.2) learn parameters, so they are modules; pass an instance as ``score=``.
- ``LocationAware`` (Chorowski et al., 2015) is Bahdanau's score that also reads where the previous
  step attended; an RNN decoder keeps those weights from step to step (models/rnn_attention.py).

Every score splits as ``score(q, k) = match(q, project_keys(k))``: the key side does not depend on the
query, so an RNN decoder, which scores one query per step against the same source, projects the keys
once per sentence (:func:`split_score`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnkit.attention.invariance import correlated

ScoreFn = Callable[[Tensor, Tensor], Tensor]


def dot(q: Tensor, k: Tensor) -> Tensor:
    """``score(q, k) = qᵀk`` (Luong "dot")."""
    return q @ k.transpose(-2, -1)


def scaled_dot(q: Tensor, k: Tensor) -> Tensor:
    """``score(q, k) = qᵀk / √d_k`` (Vaswani et al., 2017, §3.2.1).

    Why the √d_k: if the components of q and k are independent with mean 0 and variance 1, then qᵀk has
    variance d_k. Large dot products push softmax into regions with tiny gradients; dividing by √d_k
    brings the variance back to 1.
    """
    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))


SCORES: dict[str, ScoreFn] = {"dot": dot, "scaled_dot": scaled_dot}


def _additive(query_part: Tensor, key_part: Tensor, v: nn.Linear) -> Tensor:
    """``vᵀ tanh(a_i + b_j)`` for each query i, key j: ``(..., T_q, A), (..., T_k, A) -> (..., T_q, T_k)``."""
    hidden = torch.tanh(query_part.unsqueeze(-2) + key_part.unsqueeze(-3))  # (..., T_q, T_k, A)
    return v(hidden).squeeze(-1)


class LuongGeneral(nn.Module):
    """``score(q, k) = qᵀ W_a k`` (Luong "general"): a bilinear match between different spaces."""

    def __init__(self, d_q: int, d_k: int | None = None) -> None:
        super().__init__()
        self.W_a = nn.Linear(d_k or d_q, d_q, bias=False)

    def project_keys(self, k: Tensor) -> Tensor:
        return self.W_a(k)

    def match(self, q: Tensor, projected: Tensor) -> Tensor:
        return q @ projected.transpose(-2, -1)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return self.match(q, self.project_keys(k))


class LuongConcat(nn.Module):
    """``score(q, k) = v_aᵀ tanh(W_a [q; k])`` (Luong "concat").

    ``W_a [q; k]`` equals ``W_a[:, :d_q] q + W_a[:, d_q:] k``, so the concatenation is never built for
    every (query, key) pair: each half is applied once and the results are broadcast.
    """

    # ``x Wᵀ``: attnkit.cpu gives this instance its own, whose rows sum alike in any batch
    linear: Callable[..., Tensor] = staticmethod(nn.functional.linear)

    def __init__(self, d_q: int, d_k: int | None = None, d_attn: int | None = None) -> None:
        super().__init__()
        self.d_q = d_q
        self.W_a = nn.Linear(d_q + (d_k or d_q), d_attn or d_q, bias=False)
        self.v_a = nn.Linear(d_attn or d_q, 1, bias=False)

    def project_keys(self, k: Tensor) -> Tensor:
        return self.linear(k, self.W_a.weight[:, self.d_q :].contiguous())

    def match(self, q: Tensor, projected: Tensor) -> Tensor:
        return _additive(self.linear(q, self.W_a.weight[:, : self.d_q].contiguous()), projected, self.v_a)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return self.match(q, self.project_keys(k))


class BahdanauAdditive(nn.Module):
    """``score(s, h) = v_aᵀ tanh(W_a s + U_a h)`` (Bahdanau et al., 2015, eq. 6 and A.1.2).

    ``s`` is the decoder state (query) and ``h`` an encoder annotation (key). ``U_a h`` does not depend on
    the decoder step, which is why Bahdanau keeps it as a separate matrix: it can be computed once per
    source sentence.
    """

    def __init__(self, d_q: int, d_k: int | None = None, d_attn: int | None = None) -> None:
        super().__init__()
        d_attn = d_attn or d_q
        self.W_a = nn.Linear(d_q, d_attn, bias=False)
        self.U_a = nn.Linear(d_k or d_q, d_attn, bias=True)
        self.v_a = nn.Linear(d_attn, 1, bias=False)

    def project_keys(self, k: Tensor) -> Tensor:
        return self.U_a(k)

    def match(self, q: Tensor, projected: Tensor) -> Tensor:
        return _additive(self.W_a(q), projected, self.v_a)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return self.match(q, self.project_keys(k))


class LocationAware(nn.Module):
    """``e_j = wᵀ tanh(W s + V h_j + U f_j + b)`` with ``f = F * α_prev`` (Chorowski et al., 2015, eq.
    8–9, "location-aware attention"): Bahdanau's additive score plus what ``filters`` learned filters
    ``F``, each ``width`` positions wide, see of the previous step's weights ``α_prev`` around position
    ``j``. The model learns where the last step looked and can move on from there, which is what a
    monotone alignment of characters to audio frames needs (without it a long utterance's repeated
    sounds pull the attention back to the first place they occur).

    The key side ``V h_j + b`` is projected once per utterance, as Bahdanau's; ``match`` takes the
    previous weights ``(B, S)`` too. ``F * α`` is computed as PyTorch's ``conv1d`` computes it (a
    correlation: the paper's convolution with its filters reversed, the same family of learned maps).
    """

    def __init__(self, d_q: int, d_k: int | None = None, d_attn: int | None = None, filters: int = 10,
                 width: int = 15) -> None:  # fmt: skip
        super().__init__()
        d_attn = d_attn or d_q
        self.W = nn.Linear(d_q, d_attn, bias=False)
        self.V = nn.Linear(d_k or d_q, d_attn, bias=True)  # V h_j + b
        self.F = nn.Conv1d(1, filters, width, padding=width // 2, bias=False)
        self.U = nn.Linear(filters, d_attn, bias=False)
        self.w = nn.Linear(d_attn, 1, bias=False)

    def project_keys(self, k: Tensor) -> Tensor:
        return self.V(k)

    def match(self, q: Tensor, projected: Tensor, previous: Tensor) -> Tensor:
        """Scores ``(B, 1, S)`` for the query ``q (B, 1, d_q)``, the projected keys ``(B, S, A)`` and
        the previous step's weights ``previous (B, S)``."""
        previous = previous.to(projected.dtype)
        if torch.is_grad_enabled():
            f = self.F(previous.unsqueeze(1)).transpose(1, 2)  # (B, S, filters)
        else:  # in inference each row's features as it gets them alone (attnkit.attention.invariance)
            f = correlated(previous, self.F.weight)
        return _additive(self.W(q), projected + self.U(f), self.w)


def resolve_score(score: str | ScoreFn) -> ScoreFn:
    """A score given by name (``"dot"``, ``"scaled_dot"``) or as a callable/module, as a callable."""
    if callable(score):
        return score
    try:
        return SCORES[score]
    except KeyError:
        raise ValueError(
            f"unknown score {score!r}; choose one of {sorted(SCORES)} or pass a module such as LuongGeneral"
        ) from None


def split_score(score: str | ScoreFn) -> tuple[Callable[[Tensor], Tensor], ScoreFn]:
    """``(project_keys, match)`` with ``score(q, k) == match(q, project_keys(k))``; a score without
    parameters on the key side (``dot``, ``scaled_dot``) keeps the keys as they are."""
    if hasattr(score, "project_keys"):
        return score.project_keys, score.match
    return (lambda k: k), resolve_score(score)
