"""Reading fields of an HF config given as an object (``MarianConfig``, ...) or as a plain dict."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
