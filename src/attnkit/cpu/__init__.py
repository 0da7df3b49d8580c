"""attnkit's CPU fast path: the same arithmetic as the paper's modules, faster on a CPU.

The paper's modules (``attnkit.attention``, ``attnkit.nn``, ``attnkit.models``) are written with plain
``nn.Linear``, ``nn.Dropout`` and ``F.linear``, and read like the paper. This package holds what makes
them fast on a CPU, and :func:`speed_up` applies it to a built model from outside, in place, the way
torchtitan applies compilation and FSDP to a plain model: whoever trains or loads a model calls it
(the trainer, ``attnkit.loading.load_for_inference``), and the model knows nothing of it.

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
memory allocator (tcmalloc where the system has it) that the server's worker processes start with.

Every private torch interface attnkit uses lives in this package, each tried on a small example before
use, with a public fallback that gives the same outputs (tested by forcing each fallback). A model on
another device is left as it is, and so is everything this build of torch lacks a fast path for.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from attnkit.cpu.attention import CPUMultiHeadAttention, as_cpu_attention
from attnkit.cpu.dropout import as_fast_dropout
from attnkit.cpu.linear import as_onednn, pack_for_inference, quantize_int8
from attnkit.cpu.packing import PackedEncoder
from attnkit.nn.transformer import Encoder

__all__ = ["Speedups", "pack_for_inference", "quantize_int8", "speed_up"]


@dataclass
class Speedups:
    """How many modules :func:`speed_up` changed, by kind."""

    linear: int = 0
    dropout: int = 0
    attention: int = 0
    encoders: int = 0
    packed_weights: int = 0

    def __bool__(self) -> bool:
        return any(vars(self).values())


def speed_up(model: nn.Module, *, inference: bool = False) -> Speedups:
    """Apply the CPU fast path to ``model`` in place (see the module docstring) and say what changed.

    ``inference``: also keep the linear layers' weights in oneDNN's layout (one more copy of them in
    memory; a copy serves only while its weight is unchanged). Nothing happens to a model whose
    parameters are not on a CPU; calling it again changes nothing more."""
    if any(not p.is_cpu for p in model.parameters()):
        return Speedups()
    done = Speedups(
        linear=as_onednn(model), dropout=as_fast_dropout(model), attention=as_cpu_attention(model)
    )
    encoders = [module for module in model.modules() if type(module) is Encoder]
    for encoder in encoders:  # its layers' attention must take packed rows
        if all(isinstance(layer.self_attn, CPUMultiHeadAttention) for layer in encoder.layers):
            encoder.__class__ = PackedEncoder
            done.encoders += 1
    if inference:
        done.packed_weights = pack_for_inference(model)
    return done
