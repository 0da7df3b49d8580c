"""Attention heat maps: which source tokens each output token attended to."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from attnkit.attention.recording import recording
from attnkit.data.batching import make_batch
from attnkit.data.tokenizer import Tokenizer


@torch.no_grad()
def cross_attention(model, src: Tensor, tgt_in: Tensor, layer: int = -1) -> Tensor:
    """Encoder-decoder attention of one decoder layer, averaged over heads: ``(B, T_tgt, T_src)``
    (an RNN encoder-decoder has one attention: ``layer`` is ignored)."""
    if hasattr(model, "alignments"):
        return model.alignments(src, tgt_in)
    module = model.decoder.layers[layer].src_attn
    with recording([module]) as recorded:
        model(src, tgt_in)
    return recorded[module].mean(dim=1)


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


def plot_translation_attention(
    model, tokenizer: Tokenizer, source: str, output: str, path: str | Path, title: str = ""
) -> None:
    """Save the heat map of what each token of ``output`` attended to in ``source`` (see above)."""
    batch = make_batch([tokenizer.encode(source)], [tokenizer.encode(output)], tokenizer.specials)
    weights = cross_attention(model, batch.src, batch.tgt_in)[0]  # (T_tgt, T_src)
    src_tokens = tokenizer.tokens(batch.src[0].tolist())
    tgt_tokens = tokenizer.tokens(batch.tgt_out[0].tolist())  # each row predicts this token
    default = "encoder-decoder attention" + ("" if hasattr(model, "alignments") else ", last layer")
    plot_attention(weights, src_tokens, tgt_tokens, path, title=title or default)
