"""Searches that take a model's compiled decoding step (``decode.compile``, attnkit.cpu.compiled).

:class:`CompiledDecoding` is the model's own decoding (``model.decoding(src)``) with ``next_logits``
swapped: the steps after the first, one new token per row at the step's beam width, run the compiled
step on the KV cache's tensors; every other step runs the model as usual. The model knows nothing of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnkit.cpu.compiled.library import CompiledStep
from attnkit.cpu.compiled.steps import compiled_step
from attnkit.models.seq2seq import Seq2SeqDecoding

if TYPE_CHECKING:
    from attnkit.models.seq2seq import EncoderDecoder


def compiled_next_logits(step: CompiledStep, decoding: Seq2SeqDecoding, tokens: Tensor) -> Tensor:
    """:meth:`Seq2SeqDecoding.next_logits` for one new token per row, run by ``step``, the cache moved
    on as the eager step moves it: the step picks the rows to keep (beam search's ``order``) as it
    extends the self-attention keys and values, and returns them extended."""
    layers = decoding.cache.layers
    keys, values, orders = zip(*(layer.self_attn.held() for layer in layers), strict=True)
    order = orders[0] if orders[0] is not None else torch.arange(tokens.size(0))  # the same in every layer
    kept = [key.contiguous() for key in keys] + [value.contiguous() for value in values]
    kept += [layer.src_attn.key.contiguous() for layer in layers]  # (the sources kept: applied)
    kept += [layer.src_attn.value.contiguous() for layer in layers]
    out = step(tokens[:, -1:].contiguous(), order, decoding.src_mask.contiguous(), *kept)
    n = len(layers)
    for i, layer in enumerate(layers):
        layer.self_attn.hold(out[1 + i], out[1 + n + i])
    return out[0]


class CompiledDecoding(Seq2SeqDecoding):
    """``model.decoding(src)`` whose steps after the first, one new token per row at ``step``'s beam
    width, run the compiled step; every other step (the first, which also computes the cross-attention
    keys, or another beam width) runs the model as usual."""

    def __init__(self, model: EncoderDecoder, src: Tensor, use_cache: bool, step: CompiledStep, beams: int):
        super().__init__(model, src, use_cache)
        self.step, self.step_beams = step, beams

    def next_logits(self, tokens: Tensor) -> Tensor:
        cached = self.cache is not None and 0 < len(self.cache) == tokens.size(1) - 1
        if cached and self.beams == self.step_beams:
            return compiled_next_logits(self.step, self, tokens)
        return super().next_logits(tokens)


def compiled_decoding(
    model: EncoderDecoder, beams: int, warn: Callable[[str], None] | None = None
) -> Callable[[Tensor, bool], Seq2SeqDecoding] | None:
    """What searches of ``model`` with ``beams`` rows per source decode with to take its compiled step
    (:func:`compiled_step`): ``decoding(src, use_cache)``, as ``model.decoding``; None where there is
    no compiled step (the search then takes ``model.decoding``)."""
    step = compiled_step(model, beams, warn)
    if step is None:
        return None
    return lambda src, use_cache=True: CompiledDecoding(model, src, use_cache, step, beams)
