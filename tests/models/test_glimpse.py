"""The recurrent attention model (Mnih et al., 2014): its retina crops and averages the patches the paper
describes, its locations are drawn from the Gaussian policy it states, REINFORCE alone trains where it
looks, and the whole-image network it is compared with has as many parameters."""

import math

import torch
import torch.nn.functional as F

from attnkit.models.glimpse import (
    GlimpseClassifier,
    GlimpseConfig,
    WholeImageClassifier,
    WholeImageConfig,
    patch_grid,
    retina,
)
from attnkit.nn.reinforce import reinforce_loss


def _image(size=40):
    return torch.arange(size * size, dtype=torch.float64).view(1, 1, size, size) / (size * size)


def test_retina_takes_patches_each_twice_as_wide_and_averages_them_down():
    """At the centre of a 40×40 canvas the 8-pixel patch is pixels 16-23, the 16-pixel one 12-27 averaged
    over 2×2 blocks, the 32-pixel one 4-35 over 4×4 blocks (the canvas spans [-1, 1] edge to edge)."""
    image = _image()
    patches = retina(image, torch.zeros(1, 2, dtype=torch.float64), patch=8, scales=3)  # (1, 3, 8, 8)
    assert patches.shape == (1, 3, 8, 8)
    pixels = image[0, 0]
    torch.testing.assert_close(patches[0, 0], pixels[16:24, 16:24])
    torch.testing.assert_close(patches[0, 1], pixels[12:28, 12:28].view(8, 2, 8, 2).mean((1, 3)))
    torch.testing.assert_close(patches[0, 2], pixels[4:36, 4:36].view(8, 4, 8, 4).mean((1, 3)))


def test_retina_is_centred_on_the_location_and_sees_black_beyond_the_canvas():
    image = _image()
    pixels = image[0, 0]
    # x = -1 + 2·8/40, y = -1 + 2·30/40: the patch centred on pixel edges 8 (x) and 30 (y)
    centre = torch.tensor([[-1 + 16 / 40, -1 + 60 / 40]], dtype=torch.float64)
    torch.testing.assert_close(retina(image, centre, 8, 1)[0, 0], pixels[26:34, 4:12])  # rows are y
    corner = retina(image, -torch.ones(1, 2, dtype=torch.float64), 8, 1)[0, 0]  # half off the canvas
    expected = torch.zeros(8, 8, dtype=torch.float64)
    expected[4:, 4:] = pixels[:4, :4]
    torch.testing.assert_close(corner, expected)


def test_a_patchs_grid_is_torchs_affine_grid_for_a_scale_and_a_shift():
    """The sampling grid, written as a sum, is ``F.affine_grid`` for θ = [[side/W, 0, x], [0, side/H, y]]
    (align_corners=False), at any centre, on square and oblong canvases."""
    torch.manual_seed(0)
    centres = torch.empty(5, 2, dtype=torch.float64).uniform_(-1.2, 1.2)
    for side, H, W in ((8, 40, 40), (16, 40, 40), (32, 28, 60), (3, 7, 5)):
        theta = torch.zeros(5, 2, 3, dtype=torch.float64)
        theta[:, 0, 0], theta[:, 1, 1], theta[:, :, 2] = side / W, side / H, centres
        expected = F.affine_grid(theta, [5, 1, side, side], align_corners=False)
        torch.testing.assert_close(patch_grid(centres, side, H, W), expected, rtol=0, atol=1e-12)


def _model(**fields):
    torch.manual_seed(0)
    return GlimpseClassifier(GlimpseConfig(d_glimpse=16, d_hidden=32, **fields)).double()


def test_locations_follow_the_gaussian_policy_while_training_and_its_mean_when_evaluating():
    model = _model(glimpses=3, location_std=0.2)
    images = torch.rand(4000, 1, 40, 40, dtype=torch.float64)
    model.eval()
    model(images[:4])
    evaluated = model.locations  # (4, 3, 2)
    assert torch.equal(evaluated[:, 0], torch.zeros(4, 2, dtype=torch.float64))  # the first: the centre
    model(images[:4])
    assert torch.equal(model.locations, evaluated)  # no sampling
    # The same image 4,000 times: the second location's samples have the policy's mean and σ.
    model.train()
    torch.manual_seed(1)
    model(images[:1].expand(4000, -1, -1, -1))
    second, (log_prob, _) = model.locations[:, 1], model._choices
    mean = evaluated[0, 1]
    assert (second.mean(0) - mean).abs().max() < 0.02  # standard error 0.2 / √4000 = 0.003
    inside = (second.abs() < 1).all(-1)  # clipping to the canvas changes the spread at the edge only
    assert abs(second[inside].std(0).mean().item() - 0.2) < 0.02
    # log π(l) of an independent 2-D Gaussian (the samples kept inside the canvas are the unclipped ones)
    expected = (-((second - mean) ** 2) / (2 * 0.2**2) - math.log(0.2) - 0.5 * math.log(2 * math.pi)).sum(-1)
    torch.testing.assert_close(log_prob[inside, 0], expected[inside])


def test_only_reinforce_trains_where_the_model_looks():
    """The cross-entropy trains the glimpse, core and classifier networks but not the location network
    (its sample is not differentiable); the REINFORCE term, given a reward above the baseline for every
    draw, moves the policy's mean towards the draws it made."""
    model = _model(glimpses=2)
    images, labels = torch.rand(64, 1, 40, 40, dtype=torch.float64), torch.randint(10, (64,))
    model.train()
    logits = model(images)
    F.cross_entropy(logits, labels).backward(retain_graph=True)
    assert model.core.weight_hh.grad.abs().sum() > 0 and model.what.weight.grad.abs().sum() > 0
    assert model.locate.weight.grad is None
    model.zero_grad()
    # Reward the draws to the right of the mean (x above it): the mean's x must move right.
    log_prob, _ = model._choices
    drawn = model.locations[:, 1, 0]
    model.eval()
    model(images)
    mean_before = model.locations[:, 1, 0].clone()
    reward = (drawn > mean_before).double().unsqueeze(1)  # (B, 1)
    reinforce_loss(log_prob, reward, 0.5).backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.05 * p.grad
    model(images)
    assert model.locations[:, 1, 0].mean() > mean_before.mean()


def test_policy_loss_rewards_right_answers_and_fits_the_baseline():
    model = _model(glimpses=3)
    model.train()
    images, labels = torch.rand(8, 1, 40, 40, dtype=torch.float64), torch.randint(10, (8,))
    logits = model(images)
    log_prob, baseline = model._choices
    reward = (logits.argmax(-1) == labels).double().unsqueeze(1)
    expected = -((reward - baseline) * log_prob).sum() + ((baseline - reward) ** 2).sum()
    torch.testing.assert_close(model.policy_loss(logits, labels).detach(), expected.detach())
    model.eval()
    model(images)
    assert model.policy_loss(logits, labels) == 0  # nothing sampled


def test_the_whole_image_network_has_as_many_parameters_as_the_glimpse_model():
    for size in (40, 60):
        glimpse = sum(p.numel() for p in GlimpseClassifier(GlimpseConfig(image_size=size)).parameters())
        whole = WholeImageClassifier(WholeImageConfig(image_size=size))
        assert abs(sum(p.numel() for p in whole.parameters()) / glimpse - 1) < 0.01
        assert whole(torch.rand(2, 1, size, size)).shape == (2, 10)
