"""What every conversion needs: a field of an HF config (an object such as ``MarianConfig``, or a plain
dict), and loading mapped weights with a check that nothing was left out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from attnkit.errors import ConversionError

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


def load_mapped(model: nn.Module, weights: Mapping[str, Tensor], tied: set[str], family: str) -> None:
    """Load ``weights`` (our names) into ``model``: every parameter but the ``tied`` ones (which share
    a tensor with a loaded one) must be given, and nothing else."""
    result = model.load_state_dict(dict(weights), strict=False)  # strict would refuse the tied names
    if set(result.missing_keys) - tied or result.unexpected_keys:
        raise ConversionError(
            f"{family} mapping incomplete: missing {result.missing_keys}, extra {result.unexpected_keys}"
        )
