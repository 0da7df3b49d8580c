"""bf16 linear maps for CPU inference (``decode.precision=bf16``): each product is that of the inputs and
weights rounded to bf16, summed in float32 (checked against float64 sums of the rounded numbers), with
the float32 bias added; the output is float32; the bf16 copy is used where it pays, for few rows of a
small map float32's ``F.linear``; and a compiled model multiplies in bf16 too."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnkit.cpu.linear as linear_module
from attnkit.cpu.linear import OneDNNLinear, linear_precision, pack_for_inference

pytestmark = pytest.mark.skipif(
    not linear_module._packing_works(torch.bfloat16), reason="this torch's oneDNN has no bf16 linear"
)


def _layer(d_in: int, d_out: int, seed: int = 0) -> OneDNNLinear:
    torch.manual_seed(seed)
    return OneDNNLinear(d_in, d_out)


def _rounded_product(x: torch.Tensor, layer: OneDNNLinear) -> torch.Tensor:
    """The definition: inputs and weights rounded to bf16, their products summed exactly (float64), the
    sum rounded to bf16 (oneDNN's output), then the float32 bias added."""
    rounded = x.bfloat16().double() @ layer.weight.bfloat16().double().T  # (..., d_out)
    return rounded.bfloat16().float() + layer.bias


@pytest.mark.parametrize("shape", [(64, 256), (3, 40, 256), (1, 256), (67, 256)])
def test_a_bf16_weight_gives_the_product_of_the_rounded_numbers_in_float32(shape):
    layer = _layer(256, 2048)  # 2^19 weights: bf16 pays for any number of rows
    assert layer.pack_for_inference(torch.bfloat16)
    x = torch.randn(*shape)
    with torch.no_grad():
        got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (*shape[:-1], 2048)
    # float32 sums of bf16 numbers differ from exact sums in the last bf16 bit at most
    torch.testing.assert_close(got, _rounded_product(x, layer), rtol=2**-7, atol=1e-3)
    exact = x.double() @ layer.weight.double().T + layer.bias.double()
    assert (got.double() - exact).abs().max() > 1e-4  # not float32's product: bf16's rounding shows


@pytest.mark.parametrize("rows", [1, 2, 300])
def test_a_bf16_map_multiplies_every_number_of_rows_in_bf16(monkeypatch, rows):
    """The precision is chosen by the weight, never by the rows (a row's product would then depend on
    how many come with it): one row of a 256 -> 1,024 map is bf16's too."""
    layer = _layer(256, 1024)
    assert layer.pack_for_inference(torch.bfloat16)
    calls = []
    real = linear_module._onednn_linear
    spy = lambda x, *rest: calls.append(x.dtype) or real(x, *rest)  # noqa: E731
    monkeypatch.setattr(linear_module, "_onednn_linear", spy)
    x = torch.randn(rows, 256)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), _rounded_product(x, layer), rtol=2**-7, atol=1e-3)
    assert calls == [torch.bfloat16]


def test_a_small_map_keeps_a_packed_float32_copy_whatever_the_rows(monkeypatch):
    """256 x 256: rounding its inputs to bf16 costs more than its bf16 product saves at a decoding
    step's rows, so its copy is float32, for every number of rows alike."""
    layer = _layer(256, 256)
    assert layer.pack_for_inference(torch.bfloat16) and layer.packed_dtype == torch.float32
    calls = []
    real = linear_module._onednn_linear
    spy = lambda x, *rest: calls.append(x.dtype) or real(x, *rest)  # noqa: E731
    monkeypatch.setattr(linear_module, "_onednn_linear", spy)
    with torch.no_grad():
        for rows in (1, 300):
            x = torch.randn(rows, 256)
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert calls == [torch.float32, torch.float32]


def test_the_bf16_copy_retires_when_the_weight_changes_and_gradients_take_float32():
    layer = _layer(256, 2048)
    layer.pack_for_inference(torch.bfloat16)
    x = torch.randn(8, 256, requires_grad=True)
    y = layer(x)  # gradients on: the float32 weight, as training multiplies
    torch.testing.assert_close(y, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        layer.weight.mul_(2)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_a_model_says_what_its_maps_multiply_in():
    model = torch.nn.Sequential(OneDNNLinear(256, 512), torch.nn.ReLU(), OneDNNLinear(512, 256))
    assert linear_precision(model) == "fp32"
    assert pack_for_inference(model, torch.bfloat16) == 2 and linear_precision(model) == "bf16"
    linear_module.quantize_int8(model)
    assert linear_precision(model) == "int8"


def test_without_bf16_packing_a_model_keeps_float32(monkeypatch):
    """The fallback: where this torch's oneDNN cannot pack bf16 weights, no layer takes a bf16 copy."""
    monkeypatch.setattr(linear_module, "_packing_works", lambda dtype=torch.float32: dtype == torch.float32)
    model = torch.nn.Sequential(OneDNNLinear(256, 512))
    assert pack_for_inference(model, torch.bfloat16) == 0 and linear_precision(model) == "fp32"


def test_compiled_a_bf16_layer_multiplies_in_bf16_as_eager_does():
    """Under torch.compile (the compiled decoding step) the packed copy cannot serve; the layer hands the
    compiler a bf16 product of the same numbers instead."""
    layer = _layer(256, 2048).eval()
    layer.pack_for_inference(torch.bfloat16)
    x = torch.randn(16, 256)
    with torch.no_grad():
        eager = layer(x)
        compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager, rtol=2**-7, atol=1e-3)
    torch.testing.assert_close(compiled, _rounded_product(x, layer), rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize("d_out, compiled_in_bf16", [(256, True), (128, False)])
def test_compiled_a_bf16_models_maps_from_2_16_weights_multiply_in_bf16(d_out, compiled_in_bf16):
    """A 256 x 256 map of a bf16 model keeps a float32 copy for eager steps (rounding its input costs
    more than its bf16 product saves there), but a compiled step rounds inside the operation before it,
    so it multiplies in bf16: a d_model-256 model's attention output maps. A 128 x 256 map (the
    quickstart's sizes and smaller) stays float32 in both."""
    layer = _layer(256, d_out).eval()
    assert layer.pack_for_inference(torch.bfloat16) and layer.packed_dtype == torch.float32
    x = torch.randn(16, 256)
    with torch.no_grad():
        compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)(x)
        float32 = F.linear(x, layer.weight, layer.bias)
    if compiled_in_bf16:
        torch.testing.assert_close(compiled, _rounded_product(x, layer), rtol=2**-7, atol=1e-3)
        assert (compiled - float32).abs().max() > 1e-4  # bf16's rounding shows
    else:
        torch.testing.assert_close(compiled, float32, rtol=1e-5, atol=1e-5)


def _cross_attention(d_model: int = 256) -> torch.nn.Module:
    """A cross-attention module with attnkit's CPU kernels, its maps packed in bf16 as
    ``decode.precision=bf16`` packs them."""
    from attnkit.attention.multihead import MultiHeadAttention
    from attnkit.cpu import speed_up

    torch.manual_seed(0)
    attention = torch.nn.Sequential(MultiHeadAttention(d_model, 4)).eval()
    speed_up(attention)
    assert pack_for_inference(attention, torch.bfloat16) == 2
    return attention[0]


def _rounded_rows(x: torch.Tensor, layer: OneDNNLinear, start: int, stop: int) -> torch.Tensor:
    """:func:`_rounded_product` of the map of the weight's rows ``start:stop`` alone."""
    block = OneDNNLinear(layer.in_features, stop - start)
    with torch.no_grad():
        block.weight.copy_(layer.weight[start:stop])
        block.bias.copy_(layer.bias[start:stop])
    return _rounded_product(x, block)


def test_cross_attention_multiplies_the_memorys_keys_and_values_in_bf16_as_the_other_maps():
    """Cross-attention takes W^K and W^V together (2 x 256 x 256 = 2^17 weights) out of ``in_proj``: in a
    bf16 model they multiply in bf16, as every map of that size does, and not as a float32 slice."""
    attention = _cross_attention()
    memory = torch.randn(3, 7, 256)
    with torch.no_grad():
        key, value = attention.memory_keys_values(memory)  # (B, h, S, d_k) each
    merged = torch.cat([part.transpose(1, 2).reshape(3, 7, 256) for part in (key, value)], dim=-1)
    expected = _rounded_rows(memory, attention.in_proj, 256, 768)
    torch.testing.assert_close(merged, expected, rtol=2**-7, atol=1e-3)
    float32 = F.linear(memory, attention.in_proj.weight[256:], attention.in_proj.bias[256:])
    assert (merged - float32).abs().max() > 1e-4  # bf16's rounding shows


def test_compiled_cross_attention_queries_multiply_in_bf16_as_the_output_map_does():
    """W^Q of a d_model-256 cross-attention (2^16 weights) keeps a float32 copy in eager steps, and in a
    compiled step multiplies in bf16, as the attention output map of the same size does."""
    attention = _cross_attention()
    query = torch.randn(5, 1, 256)
    with torch.no_grad():
        eager = attention.project_rows(query, 0, 256)
        compiled = torch.compile(attention.project_rows, backend="aot_eager", fullgraph=True)(query, 0, 256)
    float32 = F.linear(query, attention.in_proj.weight[:256], attention.in_proj.bias[:256])
    torch.testing.assert_close(eager, float32, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        compiled, _rounded_rows(query, attention.in_proj, 0, 256), rtol=2**-7, atol=1e-3
    )
    assert (compiled - float32).abs().max() > 1e-4


def test_a_block_of_rows_retires_with_its_layers_copy_when_the_weight_changes():
    attention = _cross_attention()
    memory = torch.randn(2, 5, 256)
    with torch.no_grad():
        attention.memory_keys_values(memory)  # its block's copy made
        attention.in_proj.weight.mul_(2)
        got = attention.project_rows(memory, 256, 768)
    expected = F.linear(memory, attention.in_proj.weight[256:], attention.in_proj.bias[256:])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_an_int8_block_of_rows_is_the_int8_map_of_those_rows_alone():
    """Each output's int8 scale is its own, so a block of an int8 layer's rows multiplies exactly as a
    layer of those rows alone, quantised alone (as CTranslate2 quantises cross-attention's query map
    and its keys' and values' map)."""
    torch.manual_seed(1)
    layer = OneDNNLinear(256, 768)
    block = OneDNNLinear(256, 512)
    with torch.no_grad():
        block.weight.copy_(layer.weight[256:])
        block.bias.copy_(layer.bias[256:])
    layer.quantize_int8()
    block.quantize_int8()
    x = torch.randn(6, 256)
    with torch.no_grad():
        got, alone = layer.forward_rows(x, 256, 768), block(x)
    assert torch.equal(got, alone)
    assert (got - F.linear(x, block.weight, block.bias)).abs().max() > 1e-4  # int8's rounding shows


def _product_by_input_blocks(x: torch.Tensor, layer: OneDNNLinear, width: int) -> torch.Tensor:
    """The definition of a bf16 map summed by blocks of ``width`` inputs: each block's
    :func:`_rounded_product` without the bias (summed exactly, rounded to bf16 as oneDNN's output is),
    the blocks' sums added in float32 in their order, then the float32 bias."""
    out = None
    for start in range(0, layer.in_features, width):
        inputs = x[..., start : start + width].bfloat16().double()
        part = (inputs @ layer.weight[:, start : start + width].bfloat16().double().T).bfloat16().float()
        out = part if out is None else out + part
    return out + layer.bias


@pytest.mark.parametrize("d_in", [512, 1024, 1000])
def test_where_bf16_sums_depend_on_the_rows_a_wide_map_sums_by_blocks_of_inputs(monkeypatch, d_in):
    """Where oneDNN's bf16 kernels sum a row in an order that depends on the rows beside it (AMX tiles:
    ``bf16_rows_alike`` fails), a map of more than ``BF16_SUM_INPUTS`` inputs multiplies blocks of that
    many (summed in one pass whatever the rows) and adds their products in float32: every row the same
    bits among any number of rows, eager and compiled, and the blocks' product by definition."""
    monkeypatch.setattr(linear_module, "bf16_rows_alike", lambda: False)
    layer = _layer(d_in, 256).eval()
    assert layer.pack_for_inference(torch.bfloat16) and layer.sums_in_blocks
    width = linear_module.BF16_SUM_INPUTS
    assert len(layer.packed_weight) == -(-d_in // width)  # the packed blocks of inputs
    x = torch.randn(300, d_in, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        alone = torch.cat([layer(x[i : i + 1]) for i in range(48)])  # (48, 256)
        for count in (2, 5, 33, 40, 64, 100, 160, 300):
            assert torch.equal(layer(x[:count].view(1, count, -1))[0, :48], alone[:count]), count
        torch.testing.assert_close(
            alone, _product_by_input_blocks(x[:48], layer, width), rtol=2**-7, atol=1e-3
        )
        compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)(x[:48])
    torch.testing.assert_close(
        compiled, _product_by_input_blocks(x[:48], layer, width), rtol=2**-7, atol=1e-3
    )


def test_where_bf16_sums_are_alike_among_rows_a_wide_map_is_one_product(monkeypatch):
    """Where the probe finds a row's bf16 sum the same among any rows, a wide map keeps one packed copy
    and one product (the blocks' extra kernel calls would cost time for nothing)."""
    monkeypatch.setattr(linear_module, "bf16_rows_alike", lambda: True)
    layer = _layer(1024, 256).eval()
    assert layer.pack_for_inference(torch.bfloat16) and not layer.sums_in_blocks
    assert isinstance(layer.packed_weight, torch.Tensor)
    x = torch.randn(40, 1024)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), _rounded_product(x, layer), rtol=2**-7, atol=1e-3)
