"""Show, Attend and Tell's figure: for each image, the caption a word at a time, each word over the image
lit where the captioner attended as it wrote that word (Xu et al., 2015, Fig. 2 and 3).

Each step's weights over the ``grid × grid`` regions (models/captioner.py) are drawn as a map over the
image, each region's weight filling its 8×8 pixels, and the most attended region is outlined: for hard
attention, the one region the decoder read.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.captions import attention_while_writing
from attnkit.models.captioner import DOWNSAMPLING


@torch.no_grad()
def plot_caption_strips(
    model: torch.nn.Module, tokenizer: Tokenizer, images: Tensor, captions: list[str], path: str | Path
) -> Path:
    """Save a PNG with one row per image of ``images (N, 1, H, W)`` (pixels in [0, 1]): the image, then
    each word of its caption (``captions``: what the model wrote for it) over the attention of the step
    that wrote it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    ids, weights = attention_while_writing(model, tokenizer, images, captions)
    weights = weights.float().cpu()  # (N, T, L)
    grid = images.size(-1) // DOWNSAMPLING
    columns = 1 + max(len(t) for t in ids)
    figure, panels = plt.subplots(len(ids), columns, figsize=(1.1 * columns, 1.25 * len(ids)), squeeze=False)
    for row, words in enumerate(ids):
        image = images[row, 0].cpu().numpy()
        for column, axes in enumerate(panels[row]):
            axes.axis("off")
            if column == 0:
                axes.imshow(image, cmap="gray", vmin=0, vmax=1)
                continue
            t = column - 1
            if t >= len(words):
                continue
            attention = weights[row, t].view(grid, grid)  # row by row, as the encoder flattens them
            upsampled = attention.repeat_interleave(DOWNSAMPLING, 0).repeat_interleave(DOWNSAMPLING, 1)
            axes.imshow(image, cmap="gray", vmin=0, vmax=1)
            axes.imshow(upsampled.numpy(), cmap="magma", alpha=0.55, vmin=0, vmax=float(attention.max()))
            top, left = divmod(int(attention.argmax()), grid)
            axes.add_patch(Rectangle((left * DOWNSAMPLING - 0.5, top * DOWNSAMPLING - 0.5), DOWNSAMPLING,
                                     DOWNSAMPLING, fill=False, edgecolor="cyan", linewidth=0.8))  # fmt: skip
            axes.set_title(tokenizer.tokens([words[t]])[0], fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return Path(path)
