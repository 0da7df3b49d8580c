"""What every conversion needs: a field of an HF config (an object such as ``MarianConfig``, or a plain
dict), and loading mapped weights with a check that nothing was left out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from attnkit.errors import ConversionError
from attnkit.models import load_weights

_MISSING = object()


def hf_field(hf_config: Any, name: str, default: Any = _MISSING) -> Any:
    """``hf_config.name`` or ``hf_config[name]``; ``default`` when absent (a KeyError without one)."""
    if isinstance(hf_config, Mapping):
        if name in hf_config or default is _MISSING:
            return hf_config[name]
        return default
    value = getattr(hf_config, name, default)
    if value is _MISSING:
        raise KeyError(name)
    return value


def load_mapped(model: nn.Module, weights: Mapping[str, Tensor], family: str) -> None:
    """Load ``weights`` (our names, mapped from ``family``'s) into ``model``: every parameter must be
    given (tied ones count as given with the tensor they share) and nothing else."""
    missing, unexpected = load_weights(model, weights)
    if missing or unexpected:
        raise ConversionError(f"{family} mapping incomplete: missing {missing}, extra {unexpected}")


def require_full_softmax_attention(config: Any, family: str) -> None:
    """HF's models attend with a softmax over every key: a model with another normaliser or a local
    window would convert to one that computes something else, so it is refused."""
    if config.attention_normaliser != "softmax" or config.attention_window:
        raise ConversionError(
            f"{family} attends with a softmax over all keys; this model has attention_normaliser="
            f"{config.attention_normaliser!r}, attention_window={config.attention_window}"
        )


def require_plain_output(config: Any, family: str) -> None:
    """The peers' decoders end in one projection to the vocabulary: a pointer-generator (``model.copy``)
    also copies source tokens, which they cannot, so it is refused."""
    if getattr(config, "copy", False):
        raise ConversionError(
            f"{family} has no copy mechanism; this model mixes in copies of source tokens (model.copy=true)"
        )


def require_paper_embeddings(config: Any, family: str) -> None:
    """The peers' encoder-decoders embed as the paper does (×√d_model, no LayerNorm): a model with BERT's
    embedding (warm-started from a BERT-style encoder) would convert to one that computes something else."""
    if not getattr(config, "scale_embeddings", True) or getattr(config, "embedding_norm", False):
        raise ConversionError(
            f"{family} scales embeddings by √d_model and has no embedding LayerNorm; this model has "
            f"scale_embeddings={config.scale_embeddings}, embedding_norm={config.embedding_norm}"
        )
