"""The parts every Transformer model builds from its config, in one place: attention (with the config's
normaliser and window), the position-wise feed-forward network, and the encoder layer (self-attention
and FFN), which the encoder-decoder's encoder, BERT's stack and GPT's (causal) stack all use."""

from __future__ import annotations

from typing import Any

from attnkit.attention.multihead import MultiHeadAttention
from attnkit.nn.feedforward import PositionwiseFeedForward
from attnkit.nn.transformer import EncoderLayer


def attention(c: Any) -> MultiHeadAttention:
    """Multi-head attention of ``c.h`` heads with the config's dropout, normaliser and window."""
    return MultiHeadAttention(
        c.d_model, c.h, c.attention_dropout, normaliser=c.attention_normaliser, window=c.attention_window
    )


def feed_forward(c: Any) -> PositionwiseFeedForward:
    return PositionwiseFeedForward(c.d_model, c.d_ff, c.activation_dropout, c.activation)


def residual(c: Any) -> dict[str, Any]:
    """The residual connections' settings: dropout, post-LN or pre-LN, LayerNorm's epsilon."""
    return {"dropout": c.dropout, "norm_first": c.norm_first, "eps": c.layer_norm_eps}


def encoder_layer(c: Any) -> EncoderLayer:
    return EncoderLayer(c.d_model, attention(c), feed_forward(c), **residual(c))
