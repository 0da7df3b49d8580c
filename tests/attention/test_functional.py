"""The fast path (F.scaled_dot_product_attention) equals the reference path and a float64 oracle."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.attention import attend, attend_reference, causal_mask


def oracle_float64(q, k, v, mask=None, scale=None):
    """Softmax attention written out independently in float64."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) * (scale if scale is not None else 1 / math.sqrt(q.size(-1)))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1).nan_to_num(0.0) @ v  # all -inf rows -> NaN -> 0


@st.composite
def attention_case(draw):
    B, H = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    T_q, T_k = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    d, d_v = draw(st.sampled_from([1, 4, 8, 16])), draw(st.sampled_from([1, 4, 8]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1.0, 3.0]))
    q = torch.randn(B, H, T_q, d, generator=g) * scale
    k = torch.randn(B, H, T_k, d, generator=g) * scale
    v = torch.randn(B, H, T_k, d_v, generator=g)
    kind = draw(st.sampled_from(["none", "random", "padding", "causal", "fully_masked_row"]))
    mask = None
    if kind == "random":
        mask = torch.rand(B, 1, T_q, T_k, generator=g) > 0.5
    elif kind == "padding":
        lengths = torch.randint(0, T_k + 1, (B,), generator=g)  # length 0: every row fully masked
        mask = (torch.arange(T_k) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T_k)
    elif kind == "causal":
        mask = torch.ones(T_q, T_k, dtype=torch.bool).tril(T_k - T_q)
    elif kind == "fully_masked_row":
        mask = torch.rand(B, H, T_q, T_k, generator=g) > 0.3
        mask[..., draw(st.integers(0, T_q - 1)), :] = False
    return q, k, v, mask


@settings(max_examples=150, deadline=None)
@given(attention_case())
def test_fast_path_equals_reference_and_float64_oracle(case):
    q, k, v, mask = case
    fast, no_weights = attend(q, k, v, mask)
    reference, weights = attend_reference(q, k, v, mask, need_weights=True)
    assert no_weights is None
    assert torch.isfinite(fast).all() and torch.isfinite(reference).all()
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast.double(), oracle_float64(q, k, v, mask), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reference, weights @ v)


@settings(max_examples=40, deadline=None)
@given(attention_case())
def test_unscaled_dot_fast_path_equals_reference(case):
    q, k, v, mask = case
    fast, _ = attend(q, k, v, mask, score="dot")
    reference, _ = attend_reference(q, k, v, mask, score="dot")
    # unscaled scores reach ~100 here, and float32 softmax errs by about score × 2^-23 per weight: 1e-5
    # of the output, so the bound is 1e-4 (the scaled case above stays within 1e-5)
    torch.testing.assert_close(fast, reference, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fast.double(), oracle_float64(q, k, v, mask, scale=1.0), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("normaliser", ["softmax", "relu", "gelu", "sigmoid"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_rows_give_zero_output_and_finite_gradients(normaliser, need_weights):
    q = torch.randn(2, 2, 3, 4, requires_grad=True)
    k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    mask = torch.ones(2, 1, 3, 5, dtype=torch.bool)
    mask[1, :, 0] = False
    out, _ = attend(q, k, v, mask, normaliser=normaliser, need_weights=need_weights)
    assert (out[1, :, 0] == 0).all()
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_fast_path_is_taken_only_when_it_computes_the_same_thing(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q = k = v = torch.randn(1, 2, 3, 4)
    attend(q, k, v)
    attend(q, k, v, score="dot")
    assert len(calls) == 2
    attend(q, k, v, need_weights=True)
    attend(q, k, v, normaliser="relu")
    attend(q, k, v, score=lambda a, b: a @ b.transpose(-2, -1))
    assert len(calls) == 2


def test_weights_are_returned_per_query_and_rows_sum_to_one():
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    out, weights = attend(q, k, v, need_weights=True)
    assert out.shape == (2, 3, 6) and weights.shape == (2, 3, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3))


def test_dropout_on_weights_zeroes_and_rescales():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 64, 8), torch.randn(1, 64, 8), torch.randn(1, 64, 8)
    _, clean = attend(q, k, v, need_weights=True)
    _, dropped = attend(q, k, v, dropout_p=0.5, need_weights=True)
    kept = dropped != 0
    assert 0.4 < kept.float().mean().item() < 0.6
    torch.testing.assert_close(dropped[kept], clean[kept] * 2)
    fast_dropped, _ = attend(q, k, v, dropout_p=0.5)
    assert not torch.allclose(fast_dropped, attend(q, k, v)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.long])
def test_non_boolean_masks_are_refused_rather_than_silently_added_to_scores(dtype):
    q = k = v = torch.randn(1, 3, 4)
    with pytest.raises(TypeError, match="boolean"):
        attend(q, k, v, torch.ones(1, 3, 3, dtype=dtype))


@pytest.mark.parametrize(("t_q", "t_k"), [(7, 7), (1, 9), (3, 8)])
@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_flag_equals_an_explicit_causal_mask(t_q, t_k, need_weights):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, t_q, 16), torch.randn(2, 4, t_k, 16), torch.randn(2, 4, t_k, 16)
    expected, expected_weights = attend(q, k, v, causal_mask(t_q, t_k), need_weights=need_weights)
    out, weights = attend(q, k, v, causal=True, need_weights=need_weights)
    torch.testing.assert_close(out, expected)
    if need_weights:
        torch.testing.assert_close(weights, expected_weights)
    padding = torch.ones(2, 1, 1, t_k, dtype=torch.bool)  # (B, heads, T_q, T_k), broadcast
    padding[1, ..., : t_k // 2] = False  # the second sequence is left-padded
    torch.testing.assert_close(
        attend(q, k, v, padding, causal=True)[0], attend(q, k, v, padding & causal_mask(t_q, t_k))[0]
    )
