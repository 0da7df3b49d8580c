"""Digit scenes: two to four digits on a canvas, each in a cell of a 2×2 grid, and the caption that
names them where they are. The image-captioning task of "Show, Attend and Tell" (Xu et al., 2015) on
data made in code: a model must find each digit, read it and say where it is, in reading order.

    a 3 in the top left , an 8 in the top right and a 1 in the bottom right

The digits are scikit-learn's bundled 8×8 images doubled to 16×16 (data/cluttered_digits.py), each at a
random place within its 24×24 cell (so a cell's digit is never in the same place twice), on a 48×48
black canvas. Training, validation and test scenes draw their digits from the fixed disjoint splits of
that module, so no test digit is ever seen in training whatever the seed. Each scene also keeps where
its digits are (``corners``), which is how the tests and ``attnkit evaluate`` measure whether the
attention, as a word names a digit, is on that digit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attnkit.data.cluttered_digits import DIGIT, load_digits_split

CELL = 24  # a cell's side in pixels: a 16-pixel digit with up to 8 pixels of play
GRID = 2  # cells a side
CANVAS = GRID * CELL  # the scene's side in pixels
PLACES = ("top left", "top right", "bottom left", "bottom right")  # the cells in reading order
MIN_DIGITS, MAX_DIGITS = 2, 4
# every word a caption has: what a captioner's word tokenizer learns
CELL_WORDS = ("a", "an", "in", "the", "top", "bottom", "left", "right", ",", "and", *map(str, range(10)))


@dataclass
class Scenes:
    """Generated scenes, their captions, and where each digit is."""

    images: Tensor  # (N, CANVAS, CANVAS) uint8, 0 = black
    captions: list[str]
    digits: Tensor  # (N, 4) int64: the digit in each cell, in reading order; -1 where the cell is empty
    corners: Tensor  # (N, 4, 2) int64: each cell's digit's top-left pixel (row, column); -1 where empty

    def __len__(self) -> int:
        return len(self.captions)


def caption(digits: list[int]) -> str:
    """The caption of a scene whose cells hold ``digits`` (reading order, -1 for an empty cell): each
    digit and its place, joined by commas and a last "and" ("an 8", as it is read)."""
    parts = [
        f"{'an' if digit == 8 else 'a'} {digit} in the {place}"
        for digit, place in zip(digits, PLACES, strict=True)
        if digit >= 0
    ]
    if len(parts) == 1:
        return parts[0]
    return " , ".join(parts[:-1]) + " and " + parts[-1]


def digit_scenes(split: str, n: int, seed: int | list[int]) -> Scenes:
    """``n`` scenes of ``split``'s digits (``train``, ``valid`` or ``test``): each has 2–4 digits in
    distinct cells, chosen at random; ``seed`` decides everything (an int, or a list such as ``[run
    seed, epoch]``)."""
    images_of, labels_of = load_digits_split(split)
    rng = np.random.default_rng(seed)
    images = np.zeros((n, CANVAS, CANVAS), dtype=np.float32)
    digits = np.full((n, GRID * GRID), -1, dtype=np.int64)
    corners = np.full((n, GRID * GRID, 2), -1, dtype=np.int64)
    for i in range(n):
        count = rng.integers(MIN_DIGITS, MAX_DIGITS + 1)
        for cell in np.sort(rng.choice(GRID * GRID, size=count, replace=False)):
            chosen = rng.integers(len(labels_of))
            row, col = divmod(int(cell), GRID)
            top, left = rng.integers(CELL - DIGIT + 1, size=2) + np.array([row * CELL, col * CELL])
            images[i, top : top + DIGIT, left : left + DIGIT] = images_of[chosen]
            digits[i, cell], corners[i, cell] = labels_of[chosen], (top, left)
    pixels = torch.from_numpy(np.rint(images * 255)).to(torch.uint8)
    captions = [caption(list(row)) for row in digits]
    return Scenes(pixels, captions, torch.from_numpy(digits), torch.from_numpy(corners))
