"""In inference a row's product by a linear map is the same bits however many rows come with it and
however many threads multiply them (attnkit.cpu.linear, docs/invariance.md): in float32 (plain and
packed weights, small and large), bf16 and int8."""

from __future__ import annotations

import pytest
import torch

import attnkit.cpu.linear as linear_module
from attnkit.cpu.linear import OneDNNLinear, _onednn_linear, bf16_rows_alike

pytestmark = pytest.mark.skipif(_onednn_linear is None, reason="this torch has no oneDNN linear")


def _layer(d_out: int, d_in: int, precision: str) -> OneDNNLinear:
    torch.manual_seed(0)
    layer = OneDNNLinear(d_in, d_out)
    if precision == "int8":
        layer.quantize_int8()
    elif precision != "plain":
        if precision == "bf16" and not linear_module._packing_works(torch.bfloat16):
            pytest.skip("this torch's oneDNN packs no bf16 weights on this CPU (no AVX-512)")
        assert layer.pack_for_inference(torch.bfloat16 if precision == "bf16" else torch.float32)
    return layer


@pytest.mark.parametrize("precision", ["plain", "fp32", "bf16", "int8"])
@pytest.mark.parametrize("shape", [(256, 256), (1024, 256), (256, 2048), (512, 512), (256, 1024)])
def test_a_rows_product_is_the_same_bits_among_any_number_of_rows(precision, shape):
    layer = _layer(*shape, precision)
    x = torch.randn(300, shape[1], generator=torch.Generator().manual_seed(1))
    threads = torch.get_num_threads()
    try:
        with torch.no_grad():
            alone = torch.cat([layer(x[i : i + 1]) for i in range(40)])  # (40, d_out): one row at a time
            for count in (2, 3, 5, 17, 40, 64, 100, 160, 300):
                for n_threads in (1, 2):
                    torch.set_num_threads(n_threads)
                    got = layer(x[:count].view(1, count, -1))[0, :40]  # a batch's rows, (…, d_in) shaped
                    assert torch.equal(got, alone[:count]), (count, n_threads)
    finally:
        torch.set_num_threads(threads)


def test_training_keeps_its_own_kernels_where_it_multiplies_without_autograd(monkeypatch):
    """The fused loss (attnkit.tasks.losses) multiplies without autograd inside a training step: it
    passes ``inference=False`` and keeps training's choice (``F.linear`` for a small map), which a
    trained model's numbers depend on; inference without gradients goes to oneDNN."""
    import attnkit.cpu.linear as linear_module

    calls = []
    real = linear_module._onednn_linear
    monkeypatch.setattr(linear_module, "_onednn_linear", lambda *a: calls.append(1) or real(*a))
    x, weight = torch.randn(8, 256), torch.randn(256, 256)  # small for training, not tiny
    with torch.no_grad():
        assert torch.equal(
            linear_module.linear(x, weight, inference=False), torch.nn.functional.linear(x, weight)
        )
        assert calls == []
        linear_module.linear(x, weight)
    assert calls == [1]


@pytest.mark.parametrize("shape", [(96, 32), (32, 32), (13, 32), (128, 128)])
def test_a_tiny_maps_rows_are_summed_alike_among_any_number_of_rows(shape):
    """Maps of at most TINY_WEIGHTS weights: products summed by torch, the same bits for a row alone,
    among 2 to 300 rows (several chunks of ROWS_AT_ONCE) and on 1 or 2 threads; eq. y = x Wᵀ + b."""
    layer = _layer(*shape, "fp32")
    x = torch.randn(300, shape[1], generator=torch.Generator().manual_seed(2))
    threads = torch.get_num_threads()
    try:
        with torch.no_grad():
            alone = torch.cat([layer(x[i : i + 1]) for i in range(70)])
            exact = x[:70].double() @ layer.weight.double().T + layer.bias.double()
            torch.testing.assert_close(alone.double(), exact, rtol=1e-5, atol=1e-5)
            for count in (2, 7, 65, 300):
                for n_threads in (1, 2):
                    torch.set_num_threads(n_threads)
                    assert torch.equal(layer(x[:count])[:70], alone[:count]), (count, n_threads)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("precision", ["plain", "fp32", "bf16"])
@pytest.mark.parametrize("shape", [(256, 64), (1024, 256)])
def test_a_transposed_inputs_rows_are_summed_as_a_copy_of_them(precision, shape):
    """An image's regions arrive as a transposed view, ``(1, L, C)`` of ``(1, C, L)`` features, and a
    batch of images as a copy (reshaping several images' views cannot keep the view): each row's
    product must be the same bits either way."""
    layer = _layer(*shape, precision)
    features = torch.randn(6, shape[1], 36, generator=torch.Generator().manual_seed(3))  # (B, C, L)
    with torch.no_grad():
        batched = layer(features.transpose(1, 2))  # (6, L, d_out)
        for i in range(6):
            view = features[i : i + 1].transpose(1, 2)  # (1, L, C), not contiguous
            assert torch.equal(layer(view)[0], batched[i]), i


@pytest.mark.skipif(not linear_module._packing_works(torch.bfloat16), reason="this torch has no bf16 linear")
def test_the_bf16_probe_says_whether_a_rows_bits_depend_on_the_rows_beside_it():
    """``bf16_rows_alike`` probes one map; oneDNN's products by maps of other sizes, other numbers and
    more row counts agree with what it says: every row the same bits among any rows where it says so,
    and some row's bits changed by its company somewhere where it does not (AMX tiles:
    docs/invariance.md; the layers then sum such maps by blocks of inputs, tested below)."""
    found_differ = False
    for d_in, d_out in [(512, 768), (1024, 512), (768, 1024)]:
        generator = torch.Generator().manual_seed(d_in + d_out)
        packed = linear_module._reorder(torch.randn(d_out, d_in, generator=generator).bfloat16())
        x = torch.randn(320, d_in, generator=generator).bfloat16()
        first = linear_module._multiply(x[:32], packed, None)
        for rows in range(33, 321, 9):
            found_differ |= not torch.equal(linear_module._multiply(x[:rows], packed, None)[:32], first)
    assert found_differ == (not bf16_rows_alike())
