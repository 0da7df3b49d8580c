"""attnkit: the Transformer of "Attention Is All You Need" and the attention family around it."""

from attnkit.attention import MultiHeadAttention, attend, causal_mask, padding_mask, subsequent_mask
from attnkit.errors import AttnkitError, ConfigError
from attnkit.models import EncoderDecoder, TransformerConfig, build_transformer

__version__ = "0.1.0"

__all__ = [
    "AttnkitError",
    "ConfigError",
    "EncoderDecoder",
    "MultiHeadAttention",
    "TransformerConfig",
    "attend",
    "build_transformer",
    "causal_mask",
    "padding_mask",
    "subsequent_mask",
]
