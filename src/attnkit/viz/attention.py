"""Attention heat maps: which source tokens each output token attended to."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

from attnkit.attention.multihead import MultiHeadAttention


@contextmanager
def recording(modules: list[MultiHeadAttention]):
    """Make ``modules`` keep their last attention weights (``.last_weights``) while inside the block."""
    for m in modules:
        m.record_weights = True
    try:
        yield modules
    finally:
        for m in modules:
            m.record_weights = False


@torch.no_grad()
def cross_attention(model, src: Tensor, tgt_in: Tensor, layer: int = -1) -> Tensor:
    """Encoder-decoder attention of one decoder layer, averaged over heads: ``(B, T_tgt, T_src)``."""
    module = model.decoder.layers[layer].src_attn
    with recording([module]):
        model(src, tgt_in)
        return module.last_weights.mean(dim=1)


def plot_attention(
    weights: Tensor, src_tokens: list[str], tgt_tokens: list[str], path: str | Path, title: str = ""
):
    """Save a heat map of ``weights (T_tgt, T_src)`` with the tokens on the axes as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        figsize=(max(4, 0.35 * len(src_tokens) + 2), max(3, 0.35 * len(tgt_tokens) + 1.5))
    )
    image = axes.imshow(weights.float().cpu().numpy(), cmap="viridis", aspect="auto", vmin=0.0)
    axes.set_xticks(range(len(src_tokens)), [repr(t)[1:-1] for t in src_tokens], rotation=90)
    axes.set_yticks(range(len(tgt_tokens)), [repr(t)[1:-1] for t in tgt_tokens])
    axes.set_xlabel("source")
    axes.set_ylabel("output")
    axes.set_title(title)
    figure.colorbar(image, ax=axes, fraction=0.04)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
