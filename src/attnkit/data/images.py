"""Image files as attnkit's image models read them: one channel of 8-bit grey levels, ``(H, W)`` uint8,
0 = black (the generated canvases and scenes are white digits on black).

PNG and JPEG only, read by Pillow (which matplotlib brings). An image's size is read from its header and
compared with the model's before a pixel is decoded: a small file can declare a huge image (a PNG of
62 KB whose header says 8000 × 8000 decodes to hundreds of megabytes, a decompression bomb), so a file of
another size costs nothing but its header. Pillow's own pixel limit (``Image.MAX_IMAGE_PIXELS``) is kept:
a header beyond it is refused as Pillow refuses it. Other formats Pillow could decode (TIFF, PSD, ICO,
EPS, ...) are refused, so that no decoder but these two ever sees an upload.

A colour image becomes grey as the mean of its red, green and blue (its alpha dropped); 16-bit grey is
scaled to 0–255. A file that cannot be read, or is of another size, is a one-line error naming it.
"""

from __future__ import annotations

import contextlib
import io
import struct
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch import Tensor

from attnkit.errors import DataError

FORMATS = ("PNG", "JPEG")  # what attnkit reads (Pillow's names); no other decoder is tried


@dataclass(frozen=True)
class ImageFile:
    """An image file whose header has been read and checked, its pixels not yet decoded: ``data`` its
    bytes, ``name`` what errors call it."""

    data: bytes
    name: str
    size: int  # its side in pixels (the model's)

    def grey(self) -> Tensor:
        """Its pixels as ``(size, size)`` uint8 grey levels (decoded now)."""
        return _decoded(io.BytesIO(self.data), self.name, self.size)


def read_grey_images(paths: list[Path], size: int) -> list[Tensor]:
    """The images at ``paths``, each ``(size, size)`` grey levels (a model's input size): one line
    naming the first file that cannot be read or is of another size. Every file's header is checked
    before any is decoded."""
    files = [checked_image(_read_bytes(path), str(path), size) for path in paths]
    return [file.grey() for file in files]


def checked_image(data: bytes, name: str, size: int) -> ImageFile:
    """An image file's bytes (an upload, a file read), its header checked: PNG or JPEG, of
    ``size × size`` pixels; a one-line :class:`DataError` naming ``name`` otherwise. Decodes nothing."""
    with _opened(io.BytesIO(data), name) as image:
        _check_size(image.size, size, name)
    return ImageFile(data, name, size)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as error:
        raise DataError(f"{path}: cannot be read ({error.strerror or error})") from None


def _check_size(width_height: tuple[int, int], size: int, name: str) -> None:
    width, height = width_height
    if (height, width) != (size, size):
        raise DataError(f"{name}: an image of ({height}, {width}) pixels; this model reads ({size}, {size})")


@contextlib.contextmanager
def _opened(source: BinaryIO, name: str) -> Iterator[Any]:
    """``PIL.Image.open`` of PNG or JPEG only, its header read and nothing decoded; every refusal
    Pillow can make of a header (no image, another format, a size past its limit, a width it cannot
    hold) is one :class:`DataError` naming the file."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # between Pillow's limit and twice it, Pillow only warns: refused here too
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(source, formats=FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        limit = f"past the {Image.MAX_IMAGE_PIXELS:,} pixels any image may have"
        raise DataError(f"{name}: {_pixels_of(error)}, {limit}") from None
    except UnidentifiedImageError:
        raise DataError(f"{name}: not a PNG or JPEG image") from None
    except (OSError, ValueError, SyntaxError, MemoryError, struct.error) as error:
        raise DataError(f"{name}: not an image this can read ({type(error).__name__})") from None
    with image:
        yield image


def _pixels_of(error: Exception) -> str:
    """``"an image of 900,000,000 pixels"`` from Pillow's message, or ``"an image"``."""
    words = [word.strip("(") for word in str(error).split()]
    count = next((word for word in words if word.isdigit()), None)
    return f"an image of {int(count):,} pixels" if count else "an image"


def _decoded(source: BinaryIO, name: str, size: int) -> Tensor:
    """The pixels of a file whose header said ``size × size`` (checked again: a file may change)."""
    with _opened(source, name) as image:
        _check_size(image.size, size, name)
        try:
            pixels = _grey_levels(image)
        except (OSError, ValueError, SyntaxError, MemoryError) as error:  # a truncated or corrupt stream
            raise DataError(f"{name}: not an image this can read ({type(error).__name__}: {error})") from None
    return torch.from_numpy(pixels)


def _grey_levels(image: Any) -> np.ndarray:
    """``(H, W)`` uint8: grey as it is, 16-bit grey scaled, colour as the mean of red, green and blue."""
    if image.mode == "L":
        return np.array(image, dtype=np.uint8)  # (a copy torch may write to)
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16-bit grey PNG: 0–65535
        levels = np.asarray(image, dtype=np.float64) / 65535 * 255
    elif image.mode == "1":
        levels = np.asarray(image.convert("L"), dtype=np.float64)
    else:  # RGB, RGBA, LA, P, PA, CMYK, YCbCr: red, green and blue (alpha dropped)
        levels = np.asarray(image.convert("RGB"), dtype=np.float64).mean(-1)
    return np.rint(levels).clip(0, 255).astype(np.uint8)
