"""Sampling the next token: from ``softmax(log p / temperature)``, restricted to the ``top_k`` most
probable tokens and to the smallest set whose probability reaches ``top_p`` (Holtzman et al., 2020),
each row from its own generator, so that a row's text is its own whatever its batchmates. A
:data:`~attnkit.decode.search.Choose` for the searches of ``decode/search.py``.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from attnkit.decode.search import Choose, argmax


class Generators(Protocol):
    """Each row's generator by the row's number: a list, or a server's table of its running rows."""

    def __getitem__(self, row: int, /) -> torch.Generator: ...


def sampler(generators: Generators, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Choose:
    """Sampling from ``softmax(log p / temperature)``, restricted to the ``top_k`` most probable tokens
    (0 = all) and to the smallest set whose probability reaches ``top_p`` (Holtzman et al., 2020;
    1.0 = all). Row ``i`` draws from ``generators[i]``, so its text does not depend on the other rows
    (nor on when they end).
    ``temperature = 0`` is greedy."""

    def choose(log_probs: Tensor, rows: Tensor) -> Tensor:
        if temperature == 0:
            return argmax(log_probs)
        probs = distribution(log_probs, temperature, top_k, top_p)  # (n, V)
        chosen = zip(probs, rows.tolist(), strict=True)
        picks = [torch.multinomial(p, 1, generator=generators[i]) for p, i in chosen]
        return torch.cat(picks)

    return choose


def distribution(log_probs: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """What a row samples from, ``(N, V)`` probabilities: ``softmax(log p / temperature)`` restricted to
    the top-k / top-p set (:func:`restrict`); ``temperature > 0``."""
    return restrict(log_probs / temperature, top_k, top_p).softmax(-1)


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
