"""attnkit's CPU fast path: the same arithmetic as the paper's modules, faster on a CPU.

The paper's modules (``attnkit.attention``, ``attnkit.nn``, ``attnkit.models``) are written with plain
``nn.Linear``, ``nn.Dropout`` and ``F.linear``, and read like the paper. This package holds what makes
them fast on a CPU, and :func:`speed_up` (fast_path.py) applies it to a built model from outside, in
place, the way torchtitan applies compilation and FSDP to a plain model: whoever trains or loads a
model calls it (the trainer, ``attnkit.loading.load_for_inference``), and the model knows nothing of it.

What it swaps, each a subclass with the same parameters, buffers and state-dict keys, made so by
changing the module's class (as FSDP2's ``fully_shard`` does), so that optimizers, checkpoints,
conversions and hooks see the same model:

- ``nn.Linear`` -> :class:`~attnkit.cpu.linear.OneDNNLinear`: float32 products by oneDNN, which is
  faster than MKL's path on AMD processors (linear.py); for inference, weights kept in oneDNN's
  blocked layout (``inference=True``), or int8 weights (:func:`~attnkit.cpu.linear.quantize_int8`);
- ``nn.Dropout`` -> :class:`~attnkit.cpu.dropout.FastDropout`: a mask from fewer random draws;
- ``MultiHeadAttention`` -> :class:`~attnkit.cpu.attention.CPUMultiHeadAttention`: both of the above for
  the maps and the dropout it applies itself, and packed rows inside a packed encoder;
- ``Encoder`` -> :class:`~attnkit.cpu.packing.PackedEncoder`: position-wise work on real tokens only.

Also here, in ``compiled/``: a translation model's decoding step compiled ahead of time, which
``attnkit.decode.compiled`` hands to the searches (``decode.steps``); and in ``allocator.py``, the
memory allocator (tcmalloc where the system has it) that the ``attnkit`` command restarts itself on
and the server's worker processes start with.

Every private torch interface attnkit uses lives in this package, each tried on a small example before
use, with a public fallback that gives the same outputs (tested by forcing each fallback). A model on
another device is left as it is, and so is everything this build of torch lacks a fast path for.

The package's names are imported on first use (PEP 562), not with the package: the ``attnkit`` command
reads ``allocator.py`` before torch loads; ``from attnkit.cpu import speed_up`` works as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnkit.lazy import exports

# each name -> the module it comes from
_EXPORTS = {
    "Speedups": "attnkit.cpu.fast_path",
    "speed_up": "attnkit.cpu.fast_path",
    "pack_for_inference": "attnkit.cpu.linear",
    "quantize_int8": "attnkit.cpu.linear",
}

__all__ = ["Speedups", "pack_for_inference", "quantize_int8", "speed_up"]

if TYPE_CHECKING:  # for type checkers and editors, which do not run __getattr__
    from attnkit.cpu.fast_path import Speedups, speed_up
    from attnkit.cpu.linear import pack_for_inference, quantize_int8

__getattr__, __dir__ = exports(__name__, _EXPORTS)
