"""Where a glimpse model looked: its path of glimpses drawn over each image."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor


@torch.no_grad()
def glimpse_paths(model: torch.nn.Module, images: Tensor) -> tuple[Tensor, Tensor]:
    """The evaluation-mode glimpse locations ``(B, T, 2)`` (x, y in [-1, 1]) of ``images (B, 1, H, W)``
    and the labels the model gave them ``(B,)``."""
    model.eval()
    labels = model(images).argmax(-1)
    return model.locations, labels


def to_pixels(location: Tensor, size: int) -> Tensor:
    """Canvas coordinates in [-1, 1] (pixel edges, as ``grid_sample`` with ``align_corners=False``) to
    pixel coordinates for plotting, where pixel ``i`` is centred on ``i``."""
    return (location + 1) * size / 2 - 0.5


def on_digit(locations: Tensor, corners: Tensor, size: int, digit: int) -> Tensor:
    """How often each glimpse's centre falls on the digit: for ``locations (B, T, 2)`` (x, y in [-1, 1]),
    each digit's top-left pixel ``corners (B, 2)`` (row, column; it is ``digit`` pixels wide) on a
    ``size``-pixel canvas, the share of the B images whose glimpse t is centred on the digit's square,
    ``(T,)``. A place drawn uniformly would be on it ``(digit / size)²`` of the time."""
    pixels = to_pixels(locations, size)  # (B, T, 2): column, row
    top_left = corners.flip(-1).unsqueeze(1).to(pixels.dtype) - 0.5  # (B, 1, 2): x, y of the square's edge
    inside = (pixels >= top_left) & (pixels <= top_left + digit)  # (B, T, 2)
    return inside.all(-1).float().mean(0)


def plot_glimpse_paths(
    model: torch.nn.Module, images: Tensor, truth: Tensor, path: str | Path, columns: int = 4
) -> Path:
    """Save a PNG with one panel per image: the image, each glimpse's sharpest patch as a square coloured
    by its step (the first glimpse's widest patch dotted, the coarse view it starts from), the path
    between them numbered in order, and the model's answer against the truth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    config = model.config
    locations, answers = glimpse_paths(model, images)
    size = images.size(-1)
    rows = -(-len(images) // columns)
    figure, grid = plt.subplots(rows, columns, figsize=(2.6 * columns, 2.8 * rows), squeeze=False)
    for panel, axes in enumerate(grid.flat):
        axes.axis("off")
        if panel >= len(images):
            continue
        axes.imshow(images[panel, 0].cpu().numpy(), cmap="gray", vmin=0, vmax=1)
        points = to_pixels(locations[panel].cpu(), size)  # (T, 2): x, y
        axes.plot(points[:, 0], points[:, 1], "-", color="white", linewidth=0.6, alpha=0.7)
        colours = plt.get_cmap("autumn")(torch.linspace(0, 1, len(points)).tolist())
        for t, (x, y) in enumerate(points.tolist()):
            patches = [(config.patch, "-")] + (
                [(config.patch * 2 ** (config.scales - 1), ":")] if t == 0 else []
            )
            for side, style in patches:
                axes.add_patch(Rectangle((x - side / 2, y - side / 2), side, side, fill=False,
                                         edgecolor=colours[t], linestyle=style, linewidth=1.0))  # fmt: skip
            axes.text(x, y, str(t + 1), color=colours[t], fontsize=8, ha="center", va="center", weight="bold")
        right = "right" if answers[panel] == truth[panel] else "wrong"
        axes.set_title(f"said {answers[panel].item()}, is {truth[panel].item()} ({right})", fontsize=8)
        axes.set_xlim(-0.5, size - 0.5)
        axes.set_ylim(size - 0.5, -0.5)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)
