"""Every normaliser gives masked keys exactly zero weight and fully masked rows zeros, never NaN."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnkit.attention.normalisers import NORMALISERS, get_normaliser


def _scores_and_mask():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 4, 6, generator=g) * 3
    mask = torch.rand(2, 1, 4, 6, generator=g) > 0.4
    mask[0, 0, 1] = False  # a fully masked row
    mask[1, 0, 2] = True  # a row with every key
    return scores, mask


@pytest.mark.parametrize("name", sorted(NORMALISERS))
def test_masked_keys_get_exactly_zero_and_fully_masked_rows_are_zero(name):
    scores, mask = _scores_and_mask()
    scores.requires_grad_(True)
    weights = get_normaliser(name)(scores, mask)
    assert torch.isfinite(weights).all()
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()
    assert (weights[0, :, 1] == 0).all()
    weights.sum().backward()
    assert torch.isfinite(scores.grad).all()


def _per_row(name, scores, mask, formula):
    weights = get_normaliser(name)(scores, mask)
    full_mask = mask.expand_as(scores)
    for index in torch.cartesian_prod(*(torch.arange(n) for n in scores.shape[:-1])):
        index = tuple(index.tolist())
        keep = full_mask[index]
        if keep.any():
            expected = formula(scores[index][keep], int(keep.sum()))
            torch.testing.assert_close(weights[index][keep], expected)


def test_softmax_is_softmax_over_attendable_keys_and_rows_sum_to_one():
    scores, mask = _scores_and_mask()
    _per_row("softmax", scores, mask, lambda s, n: s.softmax(-1))
    sums = get_normaliser("softmax")(scores, mask).sum(-1)
    has_keys = mask.expand_as(scores).any(-1)
    torch.testing.assert_close(sums[has_keys], torch.ones_like(sums[has_keys]))


def test_relu_is_relu_divided_by_the_number_of_keys():
    scores, mask = _scores_and_mask()
    _per_row("relu", scores, mask, lambda s, n: F.relu(s) / n)


def test_gelu_is_gelu_divided_by_the_number_of_keys():
    scores, mask = _scores_and_mask()
    _per_row("gelu", scores, mask, lambda s, n: F.gelu(s) / n)


def test_sigmoid_has_bias_minus_log_n():
    scores, mask = _scores_and_mask()
    _per_row("sigmoid", scores, mask, lambda s, n: torch.sigmoid(s - math.log(n)))


def test_no_mask_means_every_key():
    scores, _ = _scores_and_mask()
    torch.testing.assert_close(get_normaliser("relu")(scores, None), F.relu(scores) / scores.size(-1))


def test_unknown_normaliser_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown normaliser 'tanh'.*softmax"):
        get_normaliser("tanh")
