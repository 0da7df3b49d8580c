"""Generated digit scenes (data/digit_scenes.py): each caption says which digit is in which cell, in
reading order, as the grammar writes it; each digit's pixels are where the scene says, inside its cell;
held-out scenes draw only held-out digits; the seed decides everything."""

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the scenes draw scikit-learn's digits: pip install 'attnkit[vision]'")

from attnkit.data.cluttered_digits import load_digits_split
from attnkit.data.digit_scenes import CANVAS, CELL, caption, digit_scenes


def test_a_caption_names_each_digit_and_its_cell_in_reading_order():
    assert (
        caption([3, -1, 8, 1]) == "a 3 in the top left , an 8 in the bottom left and a 1 in the bottom right"
    )
    assert caption([-1, 0, -1, 7]) == "a 0 in the top right and a 7 in the bottom right"
    assert caption([5, 6, 2, 4]) == (
        "a 5 in the top left , a 6 in the top right , a 2 in the bottom left and a 4 in the bottom right"
    )


def test_each_digit_is_where_the_scene_says_inside_its_cell():
    scenes = digit_scenes("test", 200, seed=5)
    images, _ = load_digits_split("test")
    pixels = {np.rint(image * 255).astype(np.uint8).tobytes() for image in images}
    assert scenes.images.shape == (200, CANVAS, CANVAS)
    for i in range(len(scenes)):
        digits, corners = scenes.digits[i].tolist(), scenes.corners[i].tolist()
        assert 2 <= sum(d >= 0 for d in digits) <= 4
        assert scenes.captions[i] == caption(digits)
        covered = np.zeros((CANVAS, CANVAS), dtype=bool)
        for cell, (digit, (top, left)) in enumerate(zip(digits, corners, strict=True)):
            if digit < 0:
                continue
            row, col = divmod(cell, 2)
            assert (
                row * CELL <= top <= row * CELL + CELL - 16 and col * CELL <= left <= col * CELL + CELL - 16
            )
            crop = scenes.images[i, top : top + 16, left : left + 16].numpy()
            assert crop.tobytes() in pixels  # a whole test digit, untouched
            covered[top : top + 16, left : left + 16] = True
        assert not scenes.images[i].numpy()[~covered].any()  # nothing else on the canvas


def test_held_out_scenes_draw_only_held_out_digits_and_the_seed_decides_everything():
    train, _ = load_digits_split("train")
    seen = {np.rint(image * 255).astype(np.uint8).tobytes() for image in train}
    test = digit_scenes("test", 100, seed=1)
    for i in range(len(test)):
        for digit, (top, left) in zip(test.digits[i].tolist(), test.corners[i].tolist(), strict=True):
            if digit >= 0:
                assert test.images[i, top : top + 16, left : left + 16].numpy().tobytes() not in seen
    again = digit_scenes("test", 100, seed=1)
    assert again.captions == test.captions and bool((again.images == test.images).all())
    other = digit_scenes("train", 100, seed=[1, 2])
    assert other.captions != digit_scenes("train", 100, seed=[1, 3]).captions
