"""Blocked local attention equals the reference path with a banded mask, values and gradients."""

import pytest
import torch

from attnkit.attention import attend_reference, local_window_mask
from attnkit.attention.local import attend_local
from attnkit.attention.multihead import KVCache, MultiHeadAttention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("length", "window"), [(1, 0), (7, 0), (7, 1), (10, 3), (13, 4), (9, 20), (64, 8)])
def test_blocked_local_attention_equals_the_banded_reference(length, window, causal):
    torch.manual_seed(length * 31 + window)
    q, k, v = (torch.randn(2, 3, length, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    key_valid = torch.ones(2, length, dtype=torch.bool)
    key_valid[1, max(length - 3, 1) :] = False  # the second row is padded at the end
    band = local_window_mask(length, window=window, causal=causal)  # (T, T)
    mask = band & key_valid[:, None, None, :]  # (B, 1, T, T)
    expected, _ = attend_reference(q, k, v, mask)
    got = attend_local(q, k, v, window, key_valid, causal=causal)
    torch.testing.assert_close(got, expected)
    grads = torch.autograd.grad(got.sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v))
    for a, b in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_multihead_attention_takes_the_blocked_path_and_the_band_alike():
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 4, window=3).eval()
    x = torch.randn(2, 11, 16)
    valid = torch.ones(2, 1, 11, dtype=torch.bool)
    valid[1, :, 8:] = False
    fast, _ = attention(x, mask=valid)  # blocked: a key-padding mask
    reference, weights = attention(x, mask=valid, need_weights=True)  # the band on the reference path
    torch.testing.assert_close(fast, reference, atol=1e-6, rtol=1e-5)
    assert weights is not None and torch.all(weights[..., 0, 5:] == 0)


def test_windowed_decoding_with_a_cache_reads_only_keys_in_reach_and_equals_the_full_pass():
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 4, window=2).eval()
    x = torch.randn(1, 9, 16)
    full, _ = attention(x, causal=True)
    cache = KVCache()
    steps = [attention(x[:, t : t + 1], cache=cache, causal=True)[0] for t in range(9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-6, rtol=1e-5)
