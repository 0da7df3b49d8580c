"""Image files as attnkit's image models read them: one channel of 8-bit grey levels, ``(H, W)`` uint8,
0 = black (the generated canvases and scenes are white digits on black).

PNG is read by matplotlib itself; other formats (JPEG, ...) through Pillow, which matplotlib brings. A
colour image becomes grey as the mean of its red, green and blue (its alpha dropped); pixels in [0, 1]
(PNG as matplotlib reads it) are scaled to 0–255. A file that cannot be read is a one-line error naming
it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnkit.errors import DataError


def read_grey_image(path: Path) -> Tensor:
    """The image at ``path`` as ``(H, W)`` uint8 grey levels."""
    import matplotlib.image

    try:
        pixels = np.asarray(matplotlib.image.imread(path))
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (OSError, ValueError, SyntaxError) as error:  # what PNG's reader and Pillow raise on bad bytes
        raise DataError(f"{path}: not an image this can read ({error})") from None
    if pixels.ndim == 3:
        pixels = pixels[..., :3].mean(-1)  # (H, W): red, green and blue averaged, alpha dropped
    if pixels.ndim != 2:
        raise DataError(f"{path}: an image of shape {pixels.shape}, not one of rows and columns of pixels")
    if pixels.dtype.kind == "f":  # PNG: [0, 1]
        pixels = pixels * 255
    return torch.from_numpy(np.rint(pixels).clip(0, 255).astype(np.uint8))
