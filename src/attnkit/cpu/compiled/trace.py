"""The decoding step as ``torch.export`` traces it: the model's own ``decode`` of one new token per row,
with its KV cache rebuilt from tensors, and example inputs whose sizes are symbols."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from attnkit.models.seq2seq import EncoderDecoder


class CachedStep(nn.Module):
    """``model.decode`` of one new token per row with a cache made of tensors, as export traces it:
    ``(new (R, 1), order (R,), src_mask (R, 1, S), the layers' self-attention keys, their values,
    cross-attention keys, values)`` -> ``(logits (R, V), new self-attention keys..., values...)``.
    ``order`` picks each row's cached keys (beam search's re-ranking, dropped sentences)."""

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, new: Tensor, order: Tensor, src_mask: Tensor, *cached: Tensor) -> tuple[Tensor, ...]:
        cache = self.model.new_cache()
        n = len(cache.layers)
        for i, layer in enumerate(cache.layers):
            layer.self_attn.hold(cached[i], cached[n + i], order)
            layer.src_attn.hold(cached[2 * n + i], cached[3 * n + i])
        unused_memory = cached[2 * n]  # the cross-attention reads its cache, not the memory
        hidden = self.model.decode(unused_memory, src_mask, new, cache=cache)[:, -1]  # (R, d_model)
        keys = [layer.self_attn.key for layer in cache.layers]
        values = [layer.self_attn.value for layer in cache.layers]
        return (self.model.generator(hidden), *keys, *values)


def example(model: EncoderDecoder, beams: int) -> tuple[tuple[Tensor, ...], tuple]:
    """Inputs to trace with (sizes all different, so that none is taken for another) and their
    dynamic sizes: sources N, rows R = N·beams, cached rows before the step, cached length, source
    length."""
    from torch.export import Dim

    c = model.config
    n, h, d_k = c.decoder_layers, c.h, c.d_model // c.h
    sources, before, length, source_len = 6, 33, 5, 9
    rows = sources * beams
    inputs = (
        torch.randint(4, 20, (rows, 1)),
        torch.randint(0, before, (rows,)),
        torch.ones(rows, 1, source_len, dtype=torch.bool),
        *[torch.randn(before, h, length, d_k) for _ in range(2 * n)],
        *[torch.randn(sources, h, source_len, d_k) for _ in range(2 * n)],
    )
    N = Dim("sources", min=1, max=4096)
    R = N * beams if beams > 1 else N
    # a cached length leaves room for the new position; a source has at most max_len tokens
    cached, source = Dim("cached", min=1, max=c.max_len - 1), Dim("source_len", min=1, max=c.max_len)
    self_kv = {0: Dim("before", min=1, max=4096 * beams), 2: cached}
    shapes = ({0: R}, {0: R}, {0: R, 2: source}, (*[self_kv] * (2 * n), *[{0: N, 2: source}] * (2 * n)))
    return inputs, shapes
