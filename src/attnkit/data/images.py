"""Image files as attnkit's image models read them: one channel of 8-bit grey levels, ``(H, W)`` uint8,
0 = black (the generated canvases and scenes are white digits on black).

PNG is read by matplotlib itself; other formats (JPEG, ...) through Pillow, which matplotlib brings. A
colour image becomes grey as the mean of its red, green and blue (its alpha dropped); pixels in [0, 1]
(PNG as matplotlib reads it) are scaled to 0–255. A file that cannot be read is a one-line error naming
it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from torch import Tensor

from attnkit.errors import DataError


def read_grey_image(path: Path) -> Tensor:
    """The image at ``path`` as ``(H, W)`` uint8 grey levels."""
    return _grey(path, str(path))


def read_grey_images(paths: list[Path], size: int) -> list[Tensor]:
    """The images at ``paths``, each ``(size, size)`` grey levels (a model's input size): one line
    naming the first file that cannot be read or is of another size."""
    images = [read_grey_image(path) for path in paths]
    for path, image in zip(paths, images, strict=True):
        check_image_size(image, size, str(path))
    return images


def check_image_size(image: Tensor, size: int, name: str) -> None:
    """One line naming ``name`` if ``image`` is not ``size × size`` pixels."""
    if tuple(image.shape) != (size, size):
        raise DataError(f"{name}: an image of {tuple(image.shape)} pixels; this model reads ({size}, {size})")


def grey_image_from_bytes(data: bytes, name: str) -> Tensor:
    """An image file's bytes (an upload) as ``(H, W)`` uint8 grey levels; errors name it ``name``."""
    # matplotlib reads a file object as PNG unless told otherwise; any other format name hands it to
    # Pillow, which finds the format from the bytes
    return _grey(io.BytesIO(data), name, "png" if data.startswith(PNG_SIGNATURE) else "pillow")


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _grey(source: Path | BinaryIO, name: str, format: str | None = None) -> Tensor:
    import matplotlib.image

    try:
        pixels = np.asarray(matplotlib.image.imread(source, format))
    except FileNotFoundError:
        raise DataError(f"{name}: no such file") from None
    except (OSError, ValueError, SyntaxError) as error:  # what PNG's reader and Pillow raise on bad bytes
        detail = f" ({error})" if isinstance(source, Path) else ""  # (of bytes: it names a BytesIO object)
        raise DataError(f"{name}: not an image this can read{detail}") from None
    if pixels.ndim == 3:
        pixels = pixels[..., :3].mean(-1)  # (H, W): red, green and blue averaged, alpha dropped
    if pixels.ndim != 2:
        raise DataError(f"{name}: an image of shape {pixels.shape}, not one of rows and columns of pixels")
    if pixels.dtype.kind == "f":  # PNG: [0, 1]
        pixels = pixels * 255
    return torch.from_numpy(np.rint(pixels).clip(0, 255).astype(np.uint8))
