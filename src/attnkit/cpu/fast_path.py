"""The CPU fast path applied to a built model: :func:`speed_up` (see the package's docstring)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from attnkit.cpu.attention import CPUMultiHeadAttention, as_cpu_attention
from attnkit.cpu.dropout import as_fast_dropout
from attnkit.cpu.linear import as_onednn, pack_for_inference
from attnkit.cpu.packing import PackedEncoder
from attnkit.nn.transformer import Encoder

__all__ = ["Speedups", "speed_up"]


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
    """Apply the CPU fast path to ``model`` in place (see ``attnkit.cpu``'s docstring) and say what changed.

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
