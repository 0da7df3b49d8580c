"""Speculative sampling's acceptance rule gives the model's distribution: over many draws on a small
vocabulary, the tokens it keeps at each position are counted against the model's probabilities by a
chi-square test, however poor the draft; rules a little off fail the same test."""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.decode.speculative_sampling import kept_by_sampling

V, DRAWS = 5, 20_000
# the chi-square distribution's 0.999 quantiles (a table's, e.g. NIST's Engineering Statistics
# Handbook 1.3.6.7.4): a correct rule exceeds them once in a thousand runs
CHI2_999 = {4: 18.467, 24: 51.179}


def _chi2(counts: Tensor, expected: Tensor) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def _distributions(seed: int) -> tuple[Tensor, Tensor]:
    """The model's distributions at three positions (each its own, whatever came before) and a draft's
    at the first two, unlike them (the draft even gives one token no probability)."""
    g = torch.Generator().manual_seed(seed)
    target = torch.rand(3, V, generator=g, dtype=torch.float64) + 0.05
    draft = torch.rand(2, V, generator=g, dtype=torch.float64) ** 3
    draft[:, 0] = 0.0
    return target / target.sum(-1, keepdim=True), draft / draft.sum(-1, keepdim=True)


def _runs(target: Tensor, draft: Tensor, rule) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    runs = []
    for _ in range(DRAWS):
        drafted = [int(torch.multinomial(draft[j], 1, generator=g)) for j in range(2)]
        runs.append(rule(target, draft, drafted, g))
    return runs


def test_the_kept_tokens_are_distributed_as_the_models_own_samples():
    target, draft = _distributions(seed=3)
    runs = _runs(target, draft, kept_by_sampling)
    assert all(1 <= len(run) <= 3 for run in runs)
    first = torch.bincount(torch.tensor([run[0] for run in runs]), minlength=V).double()
    assert _chi2(first, DRAWS * target[0]) < CHI2_999[4]
    # the first two tokens together, as a search writes them: a run that stopped at one token draws
    # its second at the next step from the model (here p_2 whatever came before): p_1(x) p_2(y)
    g = torch.Generator().manual_seed(8)
    pairs = torch.zeros(V, V, dtype=torch.float64)
    for run in runs:
        second = run[1] if len(run) > 1 else int(torch.multinomial(target[1], 1, generator=g))
        pairs[run[0], second] += 1
    expected = DRAWS * target[0][:, None] * target[1][None, :]
    assert _chi2(pairs.flatten(), expected.flatten()) < CHI2_999[24]


def test_rules_that_keep_every_draft_or_redraw_from_the_model_fail_the_same_test():
    """Keeping every drafted token gives the draft's distribution; drawing from the model's ``p`` rather
    than the residual after a refusal counts the tokens the draft had already offered twice."""
    target, draft = _distributions(seed=3)

    def keep_all(target, draft, drafted, generator):
        return [*drafted, int(torch.multinomial(target[2], 1, generator=generator))]

    def redraw_from_the_model(target, draft, drafted, generator):
        for j, token in enumerate(drafted):
            if float(torch.rand((), generator=generator)) * draft[j, token] > target[j, token]:
                return [*drafted[:j], int(torch.multinomial(target[j], 1, generator=generator))]
        return [*drafted, int(torch.multinomial(target[2], 1, generator=generator))]

    for rule in (keep_all, redraw_from_the_model):
        first = torch.bincount(torch.tensor([run[0] for run in _runs(target, draft, rule)]), minlength=V)
        assert _chi2(first.double(), DRAWS * target[0]) > 10 * CHI2_999[4], rule.__name__
