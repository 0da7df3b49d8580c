"""The fused output-projection loss equals the label-smoothed loss of the full logits, in values and
gradients (float64), for every generative model and the ways training and validation call it."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnkit.models import build_model, from_preset
from attnkit.tasks.losses import generative_loss, label_smoothed_loss, projected_loss, token_losses

PAD = 1


def _rows(V=5003, d=24, dtype=torch.float64, bias=True, seed=0):
    """A projection and 900 target rows (three chunks of a 5,003-token vocabulary), with padding."""
    torch.manual_seed(seed)
    layer = nn.Linear(d, V, bias=bias).to(dtype)
    hidden = torch.randn(3, 300, d, dtype=dtype, requires_grad=True)
    target = torch.randint(0, V, (3, 300))
    target[0, 250:] = PAD  # a padded tail
    return layer, hidden, target


def _grads(hidden, layer):
    out = [hidden.grad, layer.weight.grad] + ([layer.bias.grad] if layer.bias is not None else [])
    hidden.grad = None
    layer.zero_grad()
    return out


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("bias", [True, False])
def test_projected_loss_equals_label_smoothed_loss_of_the_logits(epsilon, bias):
    layer, hidden, target = _rows(bias=bias)
    total, nll = projected_loss(hidden, layer, target, epsilon, PAD)
    (0.7 * total).backward()  # a scaled loss scales the gradients computed in the forward pass
    fused = _grads(hidden, layer)
    want_total, want_nll = label_smoothed_loss(layer(hidden), target, epsilon, PAD)
    (0.7 * want_total).backward()
    torch.testing.assert_close(total, want_total, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(nll.sum(), want_nll, rtol=1e-12, atol=1e-9)
    for got, want in zip(fused, _grads(hidden, layer), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_projected_loss_per_token_nll_is_each_tokens_negative_log_likelihood():
    layer, hidden, target = _rows()
    _, nll = projected_loss(hidden, layer, target, 0.1, PAD)
    want = F.cross_entropy(layer(hidden).flatten(0, 1), target.flatten(), reduction="none").view_as(target)
    torch.testing.assert_close(nll, torch.where(target == PAD, 0.0, want.detach()))
    assert not nll.requires_grad


def test_projected_loss_under_no_grad_computes_no_gradient_and_the_same_values():
    layer, hidden, target = _rows()
    with torch.no_grad():
        total, _ = projected_loss(hidden, layer, target, 0.1, PAD)
    assert not total.requires_grad and hidden.grad is None and layer.weight.grad is None
    torch.testing.assert_close(total, label_smoothed_loss(layer(hidden), target, 0.1, PAD)[0].detach())


def test_projected_loss_in_float32_and_under_bfloat16_autocast_is_close_to_float64():
    layer, hidden, target = _rows()
    want, _ = label_smoothed_loss(layer(hidden), target, 0.1, PAD)
    layer32, hidden32 = layer.float(), hidden.detach().float().requires_grad_()
    total32, _ = projected_loss(hidden32, layer32, target, 0.1, PAD)
    torch.testing.assert_close(total32.double(), want.detach(), rtol=1e-5, atol=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        total_bf16, _ = projected_loss(hidden32, layer32, target, 0.1, PAD)
    total_bf16.backward()
    torch.testing.assert_close(total_bf16.double(), want.detach(), rtol=1e-2, atol=1.0)
    assert hidden32.grad.dtype == torch.float32 and layer32.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("preset", ["tiny", "tiny-decoder", "rnn-tiny"])
def test_generative_loss_equals_the_loss_of_each_models_logits_with_every_parameters_gradient(preset):
    """Through the model (tied embedding and output included): the gradient of every parameter."""
    torch.manual_seed(0)
    model = build_model(from_preset(preset), 1003).double()
    ids = torch.randint(4, 1003, (3, 9))
    inputs = (ids,) if preset == "tiny-decoder" else (ids, ids[:, :7])
    target = torch.randint(4, 1003, (3, inputs[-1].size(1)))
    target[1, 5:] = PAD
    total, nll = generative_loss(model, inputs, target, 0.1, PAD)
    total.backward()
    fused = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    smoothed, want_nll = token_losses(model(*inputs), target, 0.1, PAD)
    smoothed.sum().backward()
    torch.testing.assert_close(total, smoothed.sum())
    torch.testing.assert_close(nll, want_nll)
    for name, p in model.named_parameters():
        torch.testing.assert_close(fused[name], p.grad, msg=name)
