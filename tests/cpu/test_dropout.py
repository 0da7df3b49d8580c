"""attnkit's dropout: F.dropout's contract (Srivastava et al., 2014: drop with probability p, scale the
kept entries so that the expectation is unchanged) with a cheaper mask on CPU."""

from __future__ import annotations

import pytest
import torch

from attnkit.attention import attend
from attnkit.attention.functional import attend_reference
from attnkit.cpu.dropout import FastDropout as Dropout
from attnkit.cpu.dropout import dropout, keep_mask


def test_entries_are_dropped_with_probability_p_and_the_rest_scaled_by_one_over_keep():
    torch.manual_seed(0)
    x = torch.rand(400, 1000) + 0.5  # no zeros of its own
    for p in (0.1, 0.3, 0.5):
        out = dropout(x, p)
        kept = out != 0
        rate = 1 - kept.float().mean().item()
        sigma = (p * (1 - p) / x.numel()) ** 0.5
        assert abs(rate - p) < 5 * sigma + 2**-16, (p, rate)  # p, up to its 2^-16 rounding
        scale = out[kept] / x[kept]
        torch.testing.assert_close(scale, torch.full_like(scale, 1 / (1 - p)), rtol=1e-4, atol=0)
        assert abs(out.mean().item() / x.mean().item() - 1) < 0.01  # expectation unchanged


def test_neighbouring_entries_are_independent():
    """Four entries share one 64-bit draw: each lane must be its own coin (no lane correlation)."""
    torch.manual_seed(1)
    keep = keep_mask((1_000_000,), 0.5).float()
    for lag in (1, 2, 3, 4):
        correlation = torch.corrcoef(torch.stack([keep[:-lag], keep[lag:]]))[0, 1].item()
        assert abs(correlation) < 0.01, (lag, correlation)
    for lane in range(4):  # every lane keeps half, not only the mean over lanes
        assert abs(keep.view(-1, 4)[:, lane].mean().item() - 0.5) < 0.005


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(2)
    x = torch.randn(64, 33, requires_grad=True)
    out = dropout(x, 0.25)
    out.backward(torch.ones_like(out))
    kept = (out != 0).float()
    torch.testing.assert_close(x.grad, kept / 0.75)


def test_same_seed_same_mask_and_evaluation_is_the_identity():
    x = torch.randn(10, 20)
    torch.manual_seed(3)
    first = dropout(x, 0.1)
    torch.manual_seed(3)
    assert torch.equal(first, dropout(x, 0.1))
    assert not torch.equal(first, dropout(x, 0.1))  # the generator moved on
    module = Dropout(0.5).eval()
    assert module(x) is x and dropout(x, 0.0) is x


def test_where_the_cheap_mask_does_not_apply_it_is_f_dropout():
    """p = 1 and torch.compile (which generates its own random numbers) get F.dropout itself."""
    x = torch.randn(100, 50)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    seen = []

    def record(graph, example_inputs):
        seen.extend(str(node.target) for node in graph.graph.nodes)
        return graph.forward

    compiled = torch.compile(lambda t: dropout(t, 0.2), backend=record, fullgraph=True)
    out = compiled(x)
    assert any("dropout" in target for target in seen) and not any("random_" in t for t in seen), seen
    assert ((out == 0) | torch.isclose(out, x / 0.8)).all()


@pytest.mark.parametrize("causal", [False, True])
def test_attention_dropout_on_cpu_drops_weights_then_mixes_values(causal):
    """With dropout, attend on CPU is Attention = Dropout(softmax(QKᵀ/√d_k)) V: the weights, not the
    output, are dropped, and the weights of a row are scaled by 1/(1-p) where kept."""
    torch.manual_seed(5)
    q, k, v = torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    torch.manual_seed(6)
    out, _ = attend(q, k, v, dropout_p=0.3, dropout_fn=dropout, causal=causal)
    mask = torch.ones(6, 6, dtype=torch.bool).tril() if causal else None
    torch.manual_seed(6)  # the same draws, from the maths written out
    scores = q @ k.transpose(-1, -2) / 8**0.5
    weights = torch.softmax(scores if mask is None else scores.masked_fill(~mask, float("-inf")), dim=-1)
    keep = keep_mask(weights.shape, 0.3)
    expected = torch.where(keep, weights, 0.0) / (1 - round(0.3 * 2**16) / 2**16) @ v
    torch.testing.assert_close(out, expected)
    reference, _ = attend_reference(q, k, v, mask, dropout_p=0.0)
    assert not torch.allclose(out, reference)  # dropout did act
