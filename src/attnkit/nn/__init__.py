"""Layers built from ``attnkit.attention``: embeddings, positions, feed-forward, residuals, stacks."""

from attnkit.nn.embedding import Embeddings, LearnedPositionalEmbedding, PositionalEncoding, sinusoid_table
from attnkit.nn.feedforward import PositionwiseFeedForward
from attnkit.nn.residual import SublayerConnection
from attnkit.nn.transformer import Decoder, DecoderCache, DecoderLayer, Encoder, EncoderLayer, LayerCache

__all__ = [
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "Embeddings",
    "Encoder",
    "EncoderLayer",
    "LayerCache",
    "LearnedPositionalEmbedding",
    "PositionalEncoding",
    "PositionwiseFeedForward",
    "SublayerConnection",
    "sinusoid_table",
]
