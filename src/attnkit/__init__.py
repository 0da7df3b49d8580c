"""attnkit: the Transformer of "Attention Is All You Need" and the attention family around it.

The names below are imported on first use (PEP 562), not with the package: the ``attnkit`` command
must start without torch, so that it can restart itself on a faster memory allocator before torch
loads (``attnkit.cpu.allocator``); ``from attnkit import build_transformer`` works as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnkit.lazy import exports

__version__ = "0.1.0"

# each name -> the module it comes from
_EXPORTS = {
    "MultiHeadAttention": "attnkit.attention",
    "attend": "attnkit.attention",
    "causal_mask": "attnkit.attention",
    "padding_mask": "attnkit.attention",
    "subsequent_mask": "attnkit.attention",
    "AttnkitError": "attnkit.errors",
    "ConfigError": "attnkit.errors",
    "EncoderDecoder": "attnkit.models",
    "TransformerConfig": "attnkit.models",
    "build_transformer": "attnkit.models",
}

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

if TYPE_CHECKING:  # for type checkers and editors, which do not run __getattr__
    from attnkit.attention import MultiHeadAttention, attend, causal_mask, padding_mask, subsequent_mask
    from attnkit.errors import AttnkitError, ConfigError
    from attnkit.models import EncoderDecoder, TransformerConfig, build_transformer

__getattr__, __dir__ = exports(__name__, _EXPORTS)
