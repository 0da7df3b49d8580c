"""Where glimpses fall: a glimpse centre is on the digit exactly when it lies within the digit's square,
in the canvas coordinates the retina uses ([-1, 1] from the left edge of the first pixel to the right
edge of the last, as grid_sample with align_corners=False)."""

import torch

from attnkit.viz.glimpses import on_digit


def test_a_glimpse_is_on_the_digit_when_its_centre_is_within_the_digits_square():
    # A 16-pixel digit at row 10, column 20 of a 40-pixel canvas: columns 20-35 span x from
    # -1 + 2·20/40 = 0.0 to -1 + 2·36/40 = 0.8, rows 10-25 span y from -0.5 to 0.3.
    corners = torch.tensor([[10, 20]])
    places = [(0.4, -0.1, True), (0.01, -0.49, True), (0.79, 0.29, True), (-0.05, -0.1, False),
              (0.85, -0.1, False), (0.4, -0.55, False), (0.4, 0.35, False), (0.0, 0.0, True)]  # fmt: skip
    locations = torch.tensor([[[x, y] for x, y, _ in places]])  # (1, T, 2)
    assert on_digit(locations, corners, size=40, digit=16).tolist() == [float(on) for _, _, on in places]


def test_the_share_is_over_images_for_each_glimpse_and_near_the_area_for_random_places():
    corners = torch.tensor([[0, 0], [24, 24]])  # top-left and bottom-right corners of a 40-pixel canvas
    locations = torch.tensor([[[-0.9, -0.9], [0.9, 0.9]], [[-0.9, -0.9], [0.9, 0.9]]])  # both, both places
    assert on_digit(locations, corners, size=40, digit=16).tolist() == [0.5, 0.5]
    generator = torch.Generator().manual_seed(0)
    anywhere = torch.rand(20000, 1, 2, generator=generator) * 2 - 1
    corner = torch.randint(0, 25, (20000, 2), generator=generator)
    assert abs(on_digit(anywhere, corner, size=40, digit=16).item() - (16 / 40) ** 2) < 0.01
