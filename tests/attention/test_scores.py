"""Scores equal their formulas, computed pair by pair as written in the papers."""

import math

import pytest
import torch

from attnkit.attention import BahdanauAdditive, LuongConcat, LuongGeneral, attend, dot, scaled_dot
from attnkit.attention.scores import resolve_score


def _qk(d_q=5, d_k=5):
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 3, d_q, generator=g), torch.randn(2, 4, d_k, generator=g)


def _pairwise(q, k, f):
    return torch.stack(
        [
            torch.stack(
                [torch.stack([f(q[b, i], k[b, j]) for j in range(k.size(1))]) for i in range(q.size(1))]
            )
            for b in range(q.size(0))
        ]
    )


def test_dot_and_scaled_dot():
    q, k = _qk()
    torch.testing.assert_close(dot(q, k), _pairwise(q, k, torch.dot))
    torch.testing.assert_close(scaled_dot(q, k), _pairwise(q, k, torch.dot) / math.sqrt(5))


def test_scaling_by_sqrt_dk_gives_unit_variance_for_unit_variance_inputs():
    g = torch.Generator().manual_seed(2)
    d_k = 512
    q, k = torch.randn(1, 200, d_k, generator=g), torch.randn(1, 200, d_k, generator=g)
    assert dot(q, k).var().item() == pytest.approx(d_k, rel=0.1)
    assert scaled_dot(q, k).var().item() == pytest.approx(1.0, rel=0.1)


def test_luong_general_is_q_W_k():
    q, k = _qk(5, 7)
    score = LuongGeneral(5, 7)
    W = score.W_a.weight  # (d_q, d_k)
    torch.testing.assert_close(score(q, k), _pairwise(q, k, lambda a, b: a @ W @ b))


def test_luong_concat_is_v_tanh_W_concat():
    q, k = _qk(5, 7)
    score = LuongConcat(5, 7, d_attn=6)
    W, v = score.W_a.weight, score.v_a.weight[0]
    torch.testing.assert_close(
        score(q, k), _pairwise(q, k, lambda a, b: v @ torch.tanh(W @ torch.cat([a, b])))
    )


def test_bahdanau_additive_is_v_tanh_Ws_plus_Uh():
    q, k = _qk(5, 7)
    score = BahdanauAdditive(5, 7, d_attn=6)
    W, U, bias, v = score.W_a.weight, score.U_a.weight, score.U_a.bias, score.v_a.weight[0]
    torch.testing.assert_close(
        score(q, k), _pairwise(q, k, lambda s, h: v @ torch.tanh(W @ s + U @ h + bias))
    )


@pytest.mark.parametrize("module", [LuongGeneral(5), LuongConcat(5), BahdanauAdditive(5)])
def test_parameterised_scores_work_inside_attend_and_learn(module):
    q, k = _qk()
    v = torch.randn(2, 4, 3)
    mask = torch.tensor([True, True, False, True])
    out, weights = attend(q, k, v, mask, score=module, need_weights=True)
    assert out.shape == (2, 3, 3)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3))
    assert (weights[..., 2] == 0).all()
    out.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def test_unknown_score_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown score 'cosine'"):
        resolve_score("cosine")
