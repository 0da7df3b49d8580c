"""Complete models, each readable top to bottom."""

from attnkit.models.config import PRESETS, TransformerConfig
from attnkit.models.seq2seq import EncoderDecoder, Generator, build_transformer

__all__ = ["PRESETS", "EncoderDecoder", "Generator", "TransformerConfig", "build_transformer"]
