"""The tie rule every search ranks by (attnkit/ranking.py), against the rule written out in Python: the k
largest entries, largest first, of equal entries the one of lowest index first."""

from __future__ import annotations

import pytest
import torch

from attnkit.ranking import first_k, top_k


def _ruled(row: list[float], index: list[int], k: int) -> tuple[list[float], list[int]]:
    """The rule itself: entries by value (largest first), then by their index (lowest first)."""
    ranked = sorted(zip(row, index, strict=True), key=lambda entry: (-entry[0], entry[1]))[:k]
    return [value for value, _ in ranked], [at for _, at in ranked]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("ties", ["integers", "continuous", "at the last kept"])
def test_first_k_ranks_equal_entries_by_lowest_index(k, ties, dtype):
    generator = torch.Generator().manual_seed(k)
    if ties == "integers":  # ties everywhere: among the kept, and across the last one kept
        x = torch.randint(0, 4, (40, 30), generator=generator).float()
    else:
        x = torch.randn(40, 30, generator=generator)
    if ties == "at the last kept":  # the only equals: the k-th largest and one left out, anywhere
        kth = x.topk(k, dim=-1).values[:, -1]
        x[torch.arange(40), torch.randint(0, 30, (40,), generator=generator)] = kth
    x[0] = float("-inf")  # a row at its bound: every entry equal
    x[1, 5:] = float("-inf")  # fewer finite entries than some k
    x[2, ::2], x[2, 1::2] = 0.0, -0.0  # equal numbers of other bits
    x[3, ::2] = torch.nextafter(x[3, 1::2], torch.tensor(9.0))  # neighbours: floats as close as can be
    x = x.to(dtype)  # bf16: continuous numbers with equals among them
    index = torch.randperm(30, generator=generator).expand(40, -1)  # entries' own numbers, not columns
    for given in (None, index, index * (2**32 // 30)):  # indices up to the largest there may be
        values, chosen = first_k(x, k, given)
        numbers = list(range(30)) if given is None else given[0].tolist()
        for r in range(x.size(0)):
            want_values, want_index = _ruled(x[r].tolist(), numbers, k)
            assert values[r].tolist() == want_values and chosen[r].tolist() == want_index, f"row {r}"


def test_blockwise_top_k_keeps_the_rule_across_blocks():
    """Equal entries in several blocks and in the last, partial one: the lowest index first."""
    x = torch.randint(0, 3, (8, 1000), generator=torch.Generator().manual_seed(0)).float()
    values, chosen = top_k(x, 5)
    for r in range(x.size(0)):
        want_values, want_index = _ruled(x[r].tolist(), list(range(1000)), 5)
        assert values[r].tolist() == want_values and chosen[r].tolist() == want_index
