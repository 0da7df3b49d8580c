"""MultiHeadAttention equals torch.nn.MultiheadAttention with the same weights; its KV cache is exact."""

import pytest
import torch
from torch import nn

from attnkit.attention import KVCache, MultiHeadAttention, MultiHeadedAttention
from attnkit.attention.masks import causal_mask, from_key_padding_mask, padding_mask, to_torch_attn_mask

D, H = 16, 4


def _pair(seed=0, bias=True):
    torch.manual_seed(seed)
    peer = nn.MultiheadAttention(D, H, bias=bias, batch_first=True).eval()
    ours = MultiHeadAttention(D, H, bias=bias).eval()
    with torch.no_grad():
        for p in peer.parameters():
            p.normal_(0, 0.3)  # torch zero-inits biases; random ones test the mapping
        ours.in_proj.weight.copy_(peer.in_proj_weight)
        ours.out_proj.weight.copy_(peer.out_proj.weight)
        if bias:
            ours.in_proj.bias.copy_(peer.in_proj_bias)
            ours.out_proj.bias.copy_(peer.out_proj.bias)
    return ours, peer


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_with_padding_equals_torch(need_weights, bias):
    ours, peer = _pair(bias=bias)
    x = torch.randn(3, 7, D)
    ids = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 6 + [0]])
    mask = padding_mask(ids, 0)
    out, weights = ours(x, mask=mask, need_weights=need_weights)
    ref, ref_weights = peer(
        x, x, x, key_padding_mask=ids == 0, need_weights=need_weights, average_attn_weights=False
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_self_attention_equals_torch(need_weights):
    ours, peer = _pair(1)
    x = torch.randn(2, 6, D)
    mask = causal_mask(6)
    out, weights = ours(x, mask=mask, need_weights=need_weights)
    ref, ref_weights = peer(
        x, x, x, attn_mask=to_torch_attn_mask(mask), need_weights=need_weights, average_attn_weights=False
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True])
def test_cross_attention_with_memory_padding_equals_torch(need_weights):
    ours, peer = _pair(2)
    x, memory = torch.randn(2, 5, D), torch.randn(2, 8, D)
    key_padding = torch.zeros(2, 8, dtype=torch.bool)
    key_padding[1, 5:] = True
    out, weights = ours(x, memory, mask=from_key_padding_mask(key_padding), need_weights=need_weights)
    ref, ref_weights = peer(
        x, memory, memory, key_padding_mask=key_padding, need_weights=need_weights, average_attn_weights=False
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    if need_weights:
        assert weights.shape == (2, H, 5, 8)
        torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-5)


def test_incremental_self_attention_with_cache_equals_full_causal_pass():
    ours, _ = _pair(3)
    x = torch.randn(2, 6, D)
    full, _ = ours(x, mask=causal_mask(6))
    cache = KVCache()
    steps = [ours(x[:, t : t + 1], cache=cache)[0] for t in range(6)]  # one new token sees all cached
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert len(cache) == 6


def test_cross_attention_cache_projects_the_memory_once():
    ours, _ = _pair(4)
    x, memory = torch.randn(2, 1, D), torch.randn(2, 8, D)
    cache = KVCache()
    first, _ = ours(x, memory, cache=cache)
    again, _ = ours(x, torch.zeros_like(memory), cache=cache)  # the cached projection is reused
    torch.testing.assert_close(again, first)
    assert len(cache) == 8


def test_cache_reorder_selects_batch_rows():
    cache = KVCache()
    key = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 4, 5)
    cache.append(key, key + 10)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.key[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    assert cache.value[:, 0, 0, 0].tolist() == [12.0, 12.0, 10.0]


def test_reorders_before_an_append_gather_the_kept_rows_into_the_longer_cache():
    """Two reorders (beam re-ranking, then dropping a finished row) and an append give what reordering
    eagerly and concatenating gives: the kept rows' history followed by the new step."""
    torch.manual_seed(5)
    key, value = torch.randn(4, 2, 3, 5), torch.randn(4, 2, 3, 5)
    cache = KVCache()
    cache.append(key, value)
    first, second = torch.tensor([3, 3, 1, 0]), torch.tensor([0, 2, 3])
    cache.reorder(first)
    cache.reorder(second)
    assert len(cache) == 3
    new_key, new_value = torch.randn(3, 2, 1, 5), torch.randn(3, 2, 1, 5)
    got_key, got_value = cache.append(new_key, new_value)
    rows = first[second]
    assert torch.equal(got_key, torch.cat([key[rows], new_key], dim=-2))
    assert torch.equal(got_value, torch.cat([value[rows], new_value], dim=-2))
    assert torch.equal(cache.key, got_key) and len(cache) == 4
    cache.append(new_key, new_value)  # no reorder in between: a plain extension
    assert torch.equal(cache.key, torch.cat([key[rows], new_key, new_key], dim=-2))


def test_other_normalisers_reach_every_head():
    mha = MultiHeadAttention(D, H, normaliser="sigmoid")
    x = torch.randn(1, 4, D)
    _, weights = mha(x, need_weights=True)
    q, k, _ = mha.in_proj(x).chunk(3, dim=-1)
    q, k = mha._split_heads(q), mha._split_heads(k)
    expected = torch.sigmoid(q @ k.transpose(-2, -1) / (D // H) ** 0.5 - torch.log(torch.tensor(4.0)))
    torch.testing.assert_close(weights, expected)


def test_heads_must_divide_d_model_and_alias_exists():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 3)
    assert MultiHeadedAttention is MultiHeadAttention


@pytest.mark.parametrize("normaliser", ["softmax", "sigmoid"])
@pytest.mark.parametrize("t_q", [1, 3])
def test_cached_keys_shared_by_groups_of_query_rows_give_what_repeated_keys_give(normaliser, t_q):
    """A cross-attention cache with one row per source, queried by G consecutive rows per source (beam
    search's beams): the same outputs as the keys and values repeated for every row, with the padding
    mask and with a per-query mask; with weights wanted, the same weights too."""
    torch.manual_seed(0)
    N, G, S, d = 3, 4, 6, 16
    mha = MultiHeadAttention(d, 4, normaliser=normaliser).eval()
    memory = torch.randn(N, S, d)
    lengths = torch.tensor([6, 4, 2])
    key_valid = torch.arange(S)[None, :] < lengths[:, None]  # (N, S)
    query = torch.randn(N * G, t_q, d)
    for mask in (
        key_valid[:, None, :],
        key_valid[:, None, :] & (torch.rand(N, t_q, S) > 0.3) | (torch.arange(S) == 0),
    ):
        shared, repeated = KVCache(), KVCache()
        shared.append(*mha.memory_keys_values(memory))  # (N, h, S, d_k)
        repeated.append(*mha.memory_keys_values(memory.repeat_interleave(G, dim=0)))  # (N·G, h, S, d_k)
        rows_mask = mask.repeat_interleave(G, dim=0)
        with torch.no_grad():
            expected, _ = mha(query, memory.repeat_interleave(G, dim=0), mask=rows_mask, cache=repeated)
            got, _ = mha(query, memory, mask=rows_mask, cache=shared)
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
            with_weights, weights = mha(query, memory, mask=rows_mask, cache=shared, need_weights=True)
            _, expected_weights = mha(query, memory, mask=rows_mask, cache=repeated, need_weights=True)
        torch.testing.assert_close(with_weights, expected, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(weights, expected_weights)


def test_a_reordered_cache_with_gradients_still_back_propagates():
    key = torch.randn(3, 2, 2, 4, requires_grad=True)
    cache = KVCache()
    cache.append(key, key * 2)
    cache.reorder(torch.tensor([2, 0, 0]))
    got, _ = cache.append(torch.zeros(3, 2, 1, 4), torch.zeros(3, 2, 1, 4))
    got.sum().backward()
    assert key.grad[:, 0, 0, 0].tolist() == [2.0, 0.0, 1.0]  # row 0 kept twice, row 1 dropped
