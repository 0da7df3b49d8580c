"""int8 linear maps for CPU inference: dynamic quantisation as its definition reads (Jacob et al., 2018;
``torch.ao.quantization.quantize_dynamic``): weights rounded per output row to 127 steps of their
largest magnitude, inputs per row the same way at every call, products exact in integers."""

from __future__ import annotations

import torch

from attnkit.cpu.linear import OneDNNLinear as Linear
from attnkit.cpu.linear import quantize_int8


def _fake_quantised(t: torch.Tensor) -> torch.Tensor:
    """Each row rounded to the nearest of 255 levels -127..127 times max|row| / 127, in float64."""
    t = t.double()
    scale = t.abs().amax(-1, keepdim=True) / 127
    return (t / scale).round() * scale


def test_int8_linear_is_the_product_of_the_quantised_inputs_and_weights():
    torch.manual_seed(0)
    layer = Linear(96, 200)
    x = torch.randn(3, 7, 96)
    with torch.no_grad():
        exact = layer(x)
        layer.quantize_int8()
        got = layer(x)
    want = _fake_quantised(x) @ _fake_quantised(layer.weight).T + layer.bias.double()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    error = (got - exact).abs().max() / exact.abs().max()
    assert 0 < error < 0.02  # quantised: not the float32 product, but within 2% of its range


def test_training_and_the_state_dict_still_use_the_float_weights():
    torch.manual_seed(1)
    model = torch.nn.Sequential(Linear(16, 32), torch.nn.ReLU(), Linear(32, 4))
    keys = set(model.state_dict())
    assert quantize_int8(model) == 2
    assert set(model.state_dict()) == keys
    x = torch.randn(5, 16)
    model(x).sum().backward()  # with gradients: the float32 weights, exactly
    first = model[0]
    torch.testing.assert_close(first(x), torch.nn.functional.linear(x, first.weight, first.bias))
    assert first.weight.grad is not None
    with torch.no_grad():
        assert not torch.equal(first(x), torch.nn.functional.linear(x, first.weight, first.bias))
