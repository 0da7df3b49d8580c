"""Encoder and decoder layers equal torch.nn.TransformerEncoderLayer / DecoderLayer with the same weights."""

import pytest
import torch
from torch import nn

from attnkit.attention import MultiHeadAttention
from attnkit.attention.masks import causal_mask, from_key_padding_mask, to_torch_attn_mask
from attnkit.nn import DecoderLayer, Encoder, EncoderLayer, PositionwiseFeedForward, SublayerConnection

D, H, FF = 16, 4, 32


def _copy_attention(ours: MultiHeadAttention, peer: nn.MultiheadAttention) -> None:
    ours.in_proj.weight.copy_(peer.in_proj_weight)
    ours.in_proj.bias.copy_(peer.in_proj_bias)
    ours.out_proj.load_state_dict(peer.out_proj.state_dict())


def _copy_ffn_and_norms(ours, peer, n_norms):
    ours.feed_forward.w_1.load_state_dict(peer.linear1.state_dict())
    ours.feed_forward.w_2.load_state_dict(peer.linear2.state_dict())
    for j in range(n_norms):
        ours.sublayer[j].norm.load_state_dict(getattr(peer, f"norm{j + 1}").state_dict())


def _randomise(module):
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)


def _encoder_layer(norm_first):
    return EncoderLayer(D, MultiHeadAttention(D, H), PositionwiseFeedForward(D, FF), 0.0, norm_first)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_equals_torch(norm_first):
    torch.manual_seed(0)
    peer = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    _randomise(peer)
    ours = _encoder_layer(norm_first).eval()
    with torch.no_grad():
        _copy_attention(ours.self_attn, peer.self_attn)
        _copy_ffn_and_norms(ours, peer, 2)
    x = torch.randn(3, 7, D)
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[1, 4:] = True
    ref = peer(x, src_key_padding_mask=padding)
    out = ours(x, from_key_padding_mask(padding))
    keep = ~padding  # torch's inference fast path may zero padded rows; compare the real tokens
    torch.testing.assert_close(out[keep], ref[keep], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_torch(norm_first):
    torch.manual_seed(1)
    peer = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    _randomise(peer)
    ours = DecoderLayer(
        D, MultiHeadAttention(D, H), MultiHeadAttention(D, H), PositionwiseFeedForward(D, FF), 0.0, norm_first
    ).eval()
    with torch.no_grad():
        _copy_attention(ours.self_attn, peer.self_attn)
        _copy_attention(ours.src_attn, peer.multihead_attn)
        _copy_ffn_and_norms(ours, peer, 3)
    x, memory = torch.randn(2, 5, D), torch.randn(2, 9, D)
    memory_padding = torch.zeros(2, 9, dtype=torch.bool)
    memory_padding[0, 6:] = True
    tgt_mask = causal_mask(5)
    ref = peer(x, memory, tgt_mask=to_torch_attn_mask(tgt_mask), memory_key_padding_mask=memory_padding)
    out = ours(x, memory, from_key_padding_mask(memory_padding), tgt_mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def _encoder_stacks(norm_first, seed, **peer_options):
    """Two-layer stacks, ours and ``torch.nn.TransformerEncoder``, with the same random weights."""
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    peer = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(D) if norm_first else None, **peer_options)
    _randomise(peer.eval())
    ours = Encoder([_encoder_layer(norm_first) for _ in range(2)], D, norm_first=norm_first).eval()
    with torch.no_grad():
        for mine, theirs in zip(ours.layers, peer.layers, strict=True):
            _copy_attention(mine.self_attn, theirs.self_attn)
            _copy_ffn_and_norms(mine, theirs, 2)
        if norm_first:
            ours.norm.load_state_dict(peer.norm.state_dict())
    return ours, peer


def test_pre_ln_encoder_stack_with_final_norm_equals_torch():
    ours, peer = _encoder_stacks(True, 2, enable_nested_tensor=False)
    x = torch.randn(2, 6, D)
    torch.testing.assert_close(ours(x, None), peer(x), atol=1e-5, rtol=1e-5)


def test_sublayer_connection_post_ln_is_the_papers_order_and_pre_ln_the_annotated_order():
    x = torch.randn(2, 3, D)
    f = nn.Linear(D, D)
    post, pre = SublayerConnection(D, 0.0), SublayerConnection(D, 0.0, norm_first=True)
    torch.testing.assert_close(post(x, f), post.norm(x + f(x)))
    torch.testing.assert_close(pre(x, f), x + f(pre.norm(x)))


def test_feed_forward_is_max_0_xW1_b1_W2_b2_and_refuses_unknown_activations():
    ffn = PositionwiseFeedForward(D, FF)
    x = torch.randn(4, D)
    expected = torch.clamp(x @ ffn.w_1.weight.T + ffn.w_1.bias, min=0) @ ffn.w_2.weight.T + ffn.w_2.bias
    torch.testing.assert_close(ffn(x), expected)
    with pytest.raises(ValueError, match="activation"):
        PositionwiseFeedForward(D, FF, activation="swish")


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_equals_torch_on_real_tokens_of_a_padded_batch(norm_first):
    """With padding, the paper's stack computes every position; the real tokens' states are those of
    torch's encoder given the same key padding, forward and backward."""
    ours, peer = _encoder_stacks(norm_first, 3)
    x = torch.randn(4, 30, D, requires_grad=True)
    valid = torch.ones(4, 30, dtype=torch.bool)
    valid[1, 25:], valid[3, 11:] = False, False
    out = ours(x, valid.unsqueeze(-2), valid=valid)
    with torch.no_grad():
        ref = peer(x, src_key_padding_mask=~valid)
    torch.testing.assert_close(out[valid], ref[valid], atol=1e-5, rtol=1e-5)
