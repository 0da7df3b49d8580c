"""Image files as the image models read them: PNG and JPEG only, the size read from the header and
checked before a pixel is decoded (a decompression bomb costs its header), Pillow's pixel limit kept
and its refusals one line each; grey as written, colour as the mean of red, green and blue, 16-bit
grey scaled to 0–255."""

import io

import numpy as np
import pytest
from PIL import Image

from attnkit.data.images import checked_image, read_grey_images
from attnkit.errors import DataError
from tests.images import bomb


def _saved(pixels: np.ndarray, form: str, **options) -> bytes:
    written = io.BytesIO()
    Image.fromarray(pixels).save(written, form, **options)
    return written.getvalue()


def test_a_decompression_bomb_costs_its_header_and_no_pixel(no_decoding):
    data = bomb(8000)
    assert len(data) < 70_000
    with pytest.raises(
        DataError, match=r"^scene.png: an image of \(8000, 8000\) pixels; this model reads \(48, 48\)$"
    ):
        checked_image(data, "scene.png", 48)


def test_past_pillows_pixel_limit_the_header_is_refused_in_one_line(no_decoding):
    data = bomb(30000, depth=1)  # 109 KB declaring 900 million pixels: about 11 GB decoded
    limit = f"{Image.MAX_IMAGE_PIXELS:,}"
    with pytest.raises(DataError, match=f"^big.png: an image of 900,000,000 pixels, past the {limit} pixels"):
        checked_image(data, "big.png", 48)
    # between the limit and twice it Pillow only warns: refused too
    with pytest.raises(DataError, match=r"^warned.png: an image of 100,000,000 pixels, past the"):
        checked_image(bomb(10000, depth=1), "warned.png", 48)


def test_files_are_checked_before_any_is_decoded(tmp_path, no_decoding):
    small = tmp_path / "small.png"
    small.write_bytes(_saved(np.zeros((48, 48), np.uint8), "PNG"))
    large = tmp_path / "large.png"
    large.write_bytes(bomb(8000))
    with pytest.raises(DataError, match=r"large.png: an image of \(8000, 8000\) pixels"):
        read_grey_images([small, large], 48)


@pytest.mark.parametrize("form", ["TIFF", "BMP", "GIF", "ICO", "WEBP"])
def test_only_png_and_jpeg_reach_a_decoder(form, no_decoding):
    options = {"sizes": [(48, 48)]} if form == "ICO" else {}
    data = _saved(np.zeros((48, 48), np.uint8), form, **options)
    with pytest.raises(DataError, match=r"^upload: not a PNG or JPEG image$"):
        checked_image(data, "upload", 48)


def test_a_stream_broken_past_a_good_header_is_one_line():
    data = _saved(np.random.default_rng(0).integers(0, 256, (48, 48), dtype=np.uint8), "PNG")
    cut = checked_image(data[:120], "cut.png", 48)  # the header reads: the size is right
    with pytest.raises(DataError, match=r"^cut.png: not an image this can read"):
        cut.grey()
    with pytest.raises(DataError, match=r"^noise: not a PNG or JPEG image$"):
        checked_image(b"\x89PNG\r\n\x1a\n" + b"\xff" * 40, "noise", 48)


def test_grey_is_as_written_colour_the_mean_of_red_green_and_blue():
    rng = np.random.default_rng(1)
    grey = rng.integers(0, 256, (48, 48), dtype=np.uint8)
    for data in (
        _saved(grey, "PNG"),
        _saved(grey, "PNG", optimize=True),
        _saved(grey.astype(np.uint16) * 257, "PNG"),
    ):
        np.testing.assert_array_equal(checked_image(data, "grey.png", 48).grey().numpy(), grey)
    colour = rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)
    expected = np.rint(colour.astype(np.float64).mean(-1)).astype(np.uint8)
    rgba = np.concatenate([colour, np.full((48, 48, 1), 7, np.uint8)], -1)  # the alpha is dropped
    for data in (_saved(colour, "PNG"), _saved(rgba, "PNG")):
        np.testing.assert_array_equal(checked_image(data, "colour.png", 48).grey().numpy(), expected)
    jpeg = checked_image(_saved(grey, "JPEG", quality=100), "scene.jpg", 48).grey().numpy()
    assert np.abs(jpeg.astype(int) - grey).mean() < 3  # JPEG is lossy: close, not equal
