"""Names a package exports, imported on first use (PEP 562) rather than with the package.

``attnkit``, ``attnkit.cpu`` and ``attnkit.cli`` export this way so that the ``attnkit`` command starts
without torch: it may restart itself on a faster memory allocator (``attnkit.cpu.allocator``), which
must happen before torch loads, and ``import attnkit`` alone then costs milliseconds, not a second.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def exports(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, which exports each of ``names`` (name -> the
    module it comes from) by importing that module when the name is first asked for."""

    def getattr_(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name]), name)
        setattr(sys.modules[package], name, value)  # once found, an ordinary attribute
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return getattr_, dir_
