"""Cluttered digits: one of the split's digits, whole, somewhere on the canvas; clutter only from the same
split; the same canvases for the same seed; test digits never among the training ones."""

import numpy as np
import pytest
import torch

from attnkit.data.cluttered_digits import DIGIT, SPLIT_SIZES, cluttered_digits, load_digits_split

pytest.importorskip("sklearn", reason="the cluttered-digits task draws scikit-learn's bundled digits")


def test_the_splits_are_disjoint_and_fixed():
    splits = {name: load_digits_split(name) for name in SPLIT_SIZES}
    for name, (images, labels) in splits.items():
        assert images.shape == (SPLIT_SIZES[name], DIGIT, DIGIT) and len(labels) == SPLIT_SIZES[name]
        assert images.min() >= 0 and images.max() <= 1
    seen = {name: {image.tobytes() for image in images} for name, (images, _) in splits.items()}
    assert sum(map(len, seen.values())) == 1797  # all of scikit-learn's digits, none twice
    assert not (seen["test"] & seen["train"]) and not (seen["valid"] & seen["train"])
    assert np.array_equal(load_digits_split("test")[0], splits["test"][0])  # the same split every time


def test_a_canvas_without_clutter_holds_exactly_one_whole_digit_of_its_label_where_it_says():
    canvases = cluttered_digits("valid", n=20, canvas=40, clutter=0, seed=3)
    assert canvases.images.shape == (20, 40, 40) and canvases.images.dtype == torch.uint8
    digits, labels = load_digits_split("valid")
    for image, label, corner in zip(canvases.images, canvases.labels, canvases.corners, strict=True):
        found = []
        for top in range(40 - DIGIT + 1):
            for left in range(40 - DIGIT + 1):
                window = image[top : top + DIGIT, left : left + DIGIT].numpy() / 255
                outside = image.sum().item() - image[top : top + DIGIT, left : left + DIGIT].sum().item()
                same = np.abs(digits - window).max(axis=(1, 2)) < 1 / 255
                if outside == 0 and same.any():
                    assert label.item() in labels[same]
                    found.append([top, left])
        assert corner.tolist() in found  # (a digit with blank edges fits several windows)


def test_clutter_adds_pieces_and_the_seed_decides_the_canvases():
    clean = cluttered_digits("train", n=50, canvas=40, clutter=0, seed=1)
    busy = cluttered_digits("train", n=50, canvas=40, clutter=4, seed=1)
    assert ((busy.images > 0).sum() > (clean.images > 0).sum()).item()
    again = cluttered_digits("train", n=50, canvas=40, clutter=4, seed=1)
    assert torch.equal(busy.images, again.images) and torch.equal(busy.labels, again.labels)
    assert not torch.equal(busy.images, cluttered_digits("train", n=50, canvas=40, clutter=4, seed=2).images)
