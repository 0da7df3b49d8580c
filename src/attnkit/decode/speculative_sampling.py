"""The acceptance rule that makes speculative *sampling* exact (Leviathan et al., 2023, Algorithm 1;
Chen et al., 2023): the tokens it keeps are distributed exactly as the model's own samples would be.

A draft has drawn tokens ``x_1 .. x_d``, each ``x_j`` from its distribution ``q_j``; the model, in one
step, gives its own distribution ``p_j`` at each of those positions and ``p_{d+1}`` after the last.
Going left to right, ``x_j`` is kept with probability ``min(1, p_j(x_j) / q_j(x_j))``. At the first
token refused, the row takes instead one token drawn from the *residual* ``max(0, p_j - q_j)``,
normalised, and stops; if every drafted token is kept, it takes one more drawn from ``p_{d+1}``.

Why the kept token is distributed as ``p_j``: a token ``x`` comes out at position j either as the
draft's and kept, with probability ``q(x) · min(1, p(x) / q(x)) = min(q(x), p(x))``, or as the
residual's after a refusal, with probability ``(1 - Σ_y min(q(y), p(y))) · max(0, p(x) - q(x)) /
Σ_y max(0, p(y) - q(y))``; the two sums are the same number (``Σ_y max(0, p(y) - q(y)) = 1 - Σ_y
min(p(y), q(y))``), so the second term is ``max(0, p(x) - q(x))``, and ``min(q, p) + max(0, p - q) =
p``. The test draws many times on a small vocabulary and compares the counts with ``p`` by a
chi-square test (tests/decode/test_speculative_sampling.py).

A draft that proposes tokens for certain (drafts copied from the context) is the case ``q_j = 1`` at
``x_j``: ``x_j`` is kept with probability ``p_j(x_j)``, and after a refusal the row draws from ``p_j``
without ``x_j``. A draft decoder samples its guesses from its own distribution under the same settings
(temperature, top-k, top-p), which the model's is likely to resemble.

Generation with ``decode.temperature > 0`` and drafts (decode/generate.py) checks them with
:func:`sampling_judge` in decode/speculative.py's search. Each row draws from its own generator (as
``decode/sampling.py``'s rows do): the draft's guesses, the acceptance and the model's token, in an
order that depends on the row alone; and every row drafts at every step, in batches of any size (a
choice that depended on the batch, or on what drafts have cost, would change which numbers a row draws
and so its text). So a row's text is its own whatever its batchmates, and a sample of the model's
distribution, but not the text plain sampling draws from the same seed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.decode.drafts import Drafts, DraftSampling
from attnkit.decode.speculative import Judge


def kept_by_sampling(
    target: Tensor, draft: Tensor, drafted: list[int], generator: torch.Generator
) -> list[int]:
    """The tokens one row keeps of its draft ``drafted`` (d tokens, ``drafted[j]`` drawn from ``draft[j]``,
    ``draft (d, V)`` probabilities), given the model's probabilities ``target (d + 1, V)`` at each drafted
    position and after the last: the kept prefix, then one token of the model's (see the module
    docstring). Between 1 and d + 1 tokens."""
    d = len(drafted)
    for j, token in enumerate(drafted):
        p, q = float(target[j, token]), float(draft[j, token])
        if float(torch.rand((), generator=generator)) * q <= p:  # kept with probability min(1, p / q)
            continue
        residual = (target[j] - draft[j]).clamp(min=0)  # (V,): what p has that q does not
        return [*drafted[:j], int(torch.multinomial(residual, 1, generator=generator))]
    return [*drafted, int(torch.multinomial(target[d], 1, generator=generator))]


def sampling_judge(drafts: Drafts, sampling: DraftSampling) -> Judge:
    """Speculative sampling's :data:`~attnkit.decode.speculative.Judge`: row ``r`` keeps what
    :func:`kept_by_sampling` keeps of its draft, drawing from ``sampling.generators[r]``, the model's
    distribution at each checked position sampling's under ``sampling``'s settings
    (``decode/sampling.py``'s ``distribution`` of the log-probabilities), the draft's what
    ``drafts.drawn_from`` says (a point mass where it says None)."""

    def judge(scores: Tensor, rows: list[int], proposals: list[list[int]]) -> list[list[int]]:
        n, width, V = scores.shape
        target = sampling.distribution(scores.reshape(-1, V), normalised=True).view(n, width, V)
        kept = []
        for i, (r, proposal) in enumerate(zip(rows, proposals, strict=True)):
            d = len(proposal)
            drawn = drafts.drawn_from(i) if d else None
            if drawn is None:  # proposed for certain: q_j is 1 at x_j
                drawn = torch.zeros(d, V, dtype=target.dtype, device=target.device)
                drawn[torch.arange(d), torch.tensor(proposal, dtype=torch.long)] = 1.0
            kept.append(kept_by_sampling(target[i, : d + 1], drawn[:d], proposal, sampling.generators[r]))
        return kept

    return judge
