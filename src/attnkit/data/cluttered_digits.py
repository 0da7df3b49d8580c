"""Cluttered digits: a small digit somewhere on a larger canvas strewn with pieces of other digits.

The task on which Mnih et al. (2014, "Recurrent Models of Visual Attention") showed that a model taking
a few glimpses beats one that looks at every pixel: most of the canvas is empty or misleading, and the
digit can be anywhere. They used MNIST on 60×60 canvases; attnkit uses scikit-learn's bundled 8×8 digits
(1,797 images, no download), doubled to 16×16 and placed on a ``canvas``×``canvas`` image (40 by default)
with ``clutter`` 6×6 pieces cut from other digits of the same split.

The 1,797 digits are split once, with a fixed seed, into 1,297 for training, 250 for validation and
250 for testing, so that no test digit (nor any piece of one) is ever seen in training whatever the run's
seed; canvases are then generated from each split's digits (``n`` of them, seeded).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from attnkit.errors import ConfigError

SPLIT_SEED = 1797  # the digit split is fixed: the test digits are the same for every run
SPLIT_SIZES = {"train": 1297, "valid": 250, "test": 250}
DIGIT = 16  # side of a digit on the canvas (sklearn's 8×8, each pixel doubled)
PIECE = 6  # side of a clutter piece
N_CLASSES = 10


@dataclass
class Canvases:
    """Generated images and their labels."""

    images: Tensor  # (N, canvas, canvas) uint8, 0 = black
    labels: Tensor  # (N,) int64, the digit 0-9
    corners: Tensor  # (N, 2) int64: the row and column of each digit's top-left pixel (it is DIGIT wide)

    def __len__(self) -> int:
        return len(self.labels)


@lru_cache(maxsize=3)  # read once per process (importing scikit-learn takes most of a second)
def load_digits_split(split: str) -> tuple[np.ndarray, np.ndarray]:
    """The ``train``/``valid``/``test`` digits of scikit-learn's set, ``(n, 16, 16)`` in [0, 1], and
    their labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ConfigError(
            "data.task=cluttered-digits and captions draw scikit-learn's bundled digits: "
            "pip install 'attnkit[vision]'"
        ) from None
    digits = load_digits()
    order = np.random.default_rng(SPLIT_SEED).permutation(len(digits.target))
    start = {"train": 0, "valid": SPLIT_SIZES["train"], "test": SPLIT_SIZES["train"] + SPLIT_SIZES["valid"]}
    chosen = order[start[split] : start[split] + SPLIT_SIZES[split]]
    images = digits.images[chosen] / 16.0  # (n, 8, 8), sklearn's pixels are 0-16
    return images.repeat(2, axis=1).repeat(2, axis=2), digits.target[chosen]  # (n, 16, 16)


def cluttered_digits(split: str, n: int, canvas: int, clutter: int, seed: int | list[int]) -> Canvases:
    """``n`` canvases of one digit of ``split`` each at a random place, under ``clutter`` random pieces of
    the split's other digits; where they overlap, the brighter pixel wins. ``seed`` decides everything
    (an int or a list of ints, e.g. ``[run seed, epoch]``)."""
    if canvas < DIGIT:
        raise ConfigError(f"data.canvas must be at least {DIGIT} pixels (a digit's size); got {canvas}")
    digits, labels = load_digits_split(split)
    rng = np.random.default_rng(seed)
    images = np.zeros((n, canvas, canvas), dtype=np.float32)
    for _ in range(clutter):  # a piece of a random digit on each canvas, anywhere
        sources, corners = rng.integers(len(digits), size=n), rng.integers(DIGIT - PIECE + 1, size=(n, 2))
        _paste(images, _crop(digits, sources, corners, PIECE), rng)
    chosen = rng.integers(len(digits), size=n)
    corners = _paste(images, digits[chosen], rng)
    pixels = torch.from_numpy(np.rint(images * 255)).to(torch.uint8)
    return Canvases(pixels, torch.from_numpy(labels[chosen]).long(), torch.from_numpy(corners).long())


def _square(corners: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices ``(n, side, 1)`` and ``(n, 1, side)`` of ``side × side`` squares whose
    top-left corners are ``corners (n, 2)``."""
    rows = corners[:, :1] + np.arange(side)  # (n, side)
    cols = corners[:, 1:] + np.arange(side)
    return rows[:, :, None], cols[:, None, :]


def _crop(images: np.ndarray, which: np.ndarray, corners: np.ndarray, side: int) -> np.ndarray:
    """``side × side`` crops ``(n, side, side)`` of ``images[which]``, top-left at ``corners (n, 2)``."""
    return images[(which[:, None, None], *_square(corners, side))]


def _paste(canvases: np.ndarray, pieces: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Put one of ``pieces (n, h, w)`` at a random place of each of ``canvases (n, C, C)``, in place,
    keeping the brighter pixel where they overlap; return the places (top-left corners, ``(n, 2)``)."""
    n, side = len(pieces), pieces.shape[1]
    corners = rng.integers(canvases.shape[-1] - side + 1, size=(n, 2))
    where = (np.arange(n)[:, None, None], *_square(corners, side))  # (n, side, side) once broadcast
    canvases[where] = np.maximum(canvases[where], pieces)
    return corners
