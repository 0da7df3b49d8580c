"""Recording attention weights for plots and the explorer, one call at a time.

``with recording(modules) as recorded:`` makes those attention modules compute their weights on the
reference path (fast kernels cannot return them) and keep the last ones in ``recorded[module]``,
``(B, h, T_q, T_k)``. What is recorded belongs to the block, not to the modules: the block's recording
lives in a context variable, which each thread (and each asyncio task) has its own of. Two threads that
run the same model at once, two requests of a web server say, each see only their own weights, and a
forward pass outside any block records nothing. (The Annotated Transformer keeps them on the module,
``self.attn``; with a shared model that hands one request another's maps.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor, nn


class Recording:
    """The weights recorded in one ``recording`` block: ``recorded[module]`` is the last call's."""

    def __init__(self, modules: Iterable[nn.Module]) -> None:
        self.modules = {id(m) for m in modules}
        self._weights: dict[int, Tensor] = {}

    def wants(self, module: nn.Module) -> bool:
        return id(module) in self.modules

    def keep(self, module: nn.Module, weights: Tensor) -> None:
        self._weights[id(module)] = weights.detach()

    def __getitem__(self, module: nn.Module) -> Tensor:
        try:
            return self._weights[id(module)]
        except KeyError:
            raise KeyError(f"no weights were recorded for this {type(module).__name__}") from None


_ACTIVE: ContextVar[Recording | None] = ContextVar("attnkit_attention_recording", default=None)


@contextmanager
def recording(modules: Iterable[nn.Module]) -> Iterator[Recording]:
    """Record the attention weights of ``modules`` in this thread while inside the block (see above)."""
    recorded = Recording(modules)
    token = _ACTIVE.set(recorded)
    try:
        yield recorded
    finally:
        _ACTIVE.reset(token)


def recording_of(module: nn.Module) -> Recording | None:
    """The recording that wants ``module``'s weights in this call, if any (never while compiling: a
    compiled step records nothing)."""
    if torch.compiler.is_compiling():
        return None
    recorded = _ACTIVE.get()
    return recorded if recorded is not None and recorded.wants(module) else None
