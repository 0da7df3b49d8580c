"""Weights packed in oneDNN's layout for CPU inference: the same products as ``x Wᵀ + b`` (checked in
float64), used only while the weight is the one that was packed, without gradients, for any number of
rows; and a model loaded for inference translates exactly as the unpacked model does."""

from __future__ import annotations

import pytest
import torch

import attnkit.cpu.linear as linear_module
from attnkit.cpu.linear import OneDNNLinear as Linear
from attnkit.cpu.linear import pack_for_inference

pytestmark = pytest.mark.skipif(linear_module._onednn_linear is None, reason="this torch has no oneDNN")


def _exact(x: torch.Tensor, layer: Linear) -> torch.Tensor:
    return x.double() @ layer.weight.double().T + layer.bias.double()


@pytest.fixture
def weights_seen(monkeypatch) -> list[bool]:
    """Whether each oneDNN call got a packed (oneDNN-layout) weight."""
    seen: list[bool] = []
    real = linear_module._onednn_linear
    linear_module._packing_works(torch.float32)  # probed before the spy, as the layer asks: not its call

    def spy(x, weight, *args):
        seen.append(weight.is_mkldnn)
        return real(x, weight, *args)

    monkeypatch.setattr(linear_module, "_onednn_linear", spy)
    return seen


def _layer(seed: int = 0) -> Linear:
    torch.manual_seed(seed)
    return Linear(256, 2048)  # 2^19 weights: oneDNN multiplies it for any number of rows


@pytest.mark.parametrize("shape", [(2, 256), (5, 256), (3, 11, 256), (160, 256), (67, 256), (4, 67, 256)])
def test_packed_weights_give_the_product_and_are_used(shape, weights_seen):
    """Also for row counts that the kernel pads (67 -> 68 rows, 268 -> 272): the padding is cut off."""
    layer = _layer()
    assert layer.pack_for_inference()
    x = torch.randn(*shape)
    with torch.no_grad():
        got = layer(x)
    assert got.shape == (*shape[:-1], 2048)
    torch.testing.assert_close(got.double(), _exact(x, layer), rtol=1e-5, atol=1e-4)
    assert weights_seen == [True]


def test_in_inference_few_rows_go_to_onednn_and_its_packed_weight_where_there_is_one(weights_seen):
    """In training, 5 rows of a mid-sized weight (Q, K and V of d_model 256) go to ``F.linear``, which is
    faster there; in inference, to oneDNN whatever the rows, so that a row's product does not depend on
    how many come with it (docs/invariance.md); packed, to its packed copy."""
    torch.manual_seed(0)
    layer = Linear(256, 768)
    x = torch.randn(5, 1, 256)  # one sentence's 5 beams, one step
    linear_module.linear(x.requires_grad_(), layer.weight, layer.bias)
    assert weights_seen == []  # training: too few multiply-adds for oneDNN
    with torch.no_grad():
        linear_module.linear(x, layer.weight, layer.bias)
        assert layer.pack_for_inference()
        got = layer(x)
    assert weights_seen == [False, True]
    torch.testing.assert_close(got.double(), _exact(x, layer), rtol=1e-5, atol=1e-4)


def test_one_row_takes_the_packed_weight_and_gradients_the_plain_one(weights_seen):
    layer = _layer()
    layer.pack_for_inference()
    with torch.no_grad():
        one = torch.randn(1, 256)
        assert torch.equal(layer(one), layer(torch.cat([one, torch.randn(7, 256)]))[:1])  # as among others
    x = torch.randn(4, 256)
    layer(x).sum().backward()  # with gradients: the autograd path, on the parameter itself
    assert weights_seen == [True, True, False]
    torch.testing.assert_close(layer.weight.grad, torch.ones(2048, 1) * x.sum(0))


def test_a_changed_weight_retires_the_packed_copy(weights_seen):
    layer = _layer()
    layer.pack_for_inference()
    x = torch.randn(8, 256)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer(x).pow(2).sum().backward()
    optimizer.step()  # an in-place update of the weight
    with torch.no_grad():
        got = layer(x)
        torch.testing.assert_close(got.double(), _exact(x, layer), rtol=1e-5, atol=1e-4)
        layer.load_state_dict(_layer(seed=1).state_dict())  # another in-place copy
        torch.testing.assert_close(layer(x).double(), _exact(x, layer), rtol=1e-5, atol=1e-4)
    assert True not in weights_seen[1:]  # after the update: never the stale packed weight


def test_every_layer_is_packed_and_the_state_dict_left_alone():
    """Small layers too: in inference every product goes to oneDNN, whatever its size (a row's product
    must not depend on how many rows come with it), and a packed copy is the faster there."""
    model = torch.nn.Sequential(Linear(256, 2048), Linear(32, 32))
    keys = set(model.state_dict())
    assert pack_for_inference(model) == 2
    assert model[1].packed_weight is not None
    assert set(model.state_dict()) == keys


def test_a_model_loaded_for_inference_translates_as_the_unpacked_model(tmp_path, weights_seen):
    from attnkit.config import load_run_config
    from attnkit.decode.translate import translate
    from attnkit.loading import load_for_inference
    from attnkit.train.loop import Trainer

    settings = ["data.task=dates", "data.tokenizer=char", "data.n_train=64", "data.n_valid=8",
                "model.d_model=256", "model.h=4", "model.d_ff=1024", "model.encoder_layers=1",
                "model.decoder_layers=1", "train.max_steps=2", "train.eval_every=2"]  # fmt: skip
    Trainer(load_run_config(None, settings), tmp_path / "run", echo=lambda m: None).fit()
    packed, tokenizer, config = load_for_inference(tmp_path / "run")
    plain, _, _ = load_for_inference(tmp_path / "run", pack=False)
    assert any(isinstance(m, Linear) and m.packed_weight is not None for m in packed.modules())
    assert all(getattr(m, "packed_weight", None) is None for m in plain.modules())
    dates = ["3 March 1999", "December 12, 2004", "1 jan 1970", "the 5th of May 2020"]
    weights_seen.clear()
    want = translate(plain, tokenizer, dates, config.decode, beam_size=5)
    assert True not in weights_seen
    assert translate(packed, tokenizer, dates, config.decode, beam_size=5) == want
    assert True in weights_seen


def test_packed_weights_read_non_contiguous_rows(weights_seen):
    layer = _layer()
    layer.pack_for_inference()
    x = torch.randn(256, 6).t()  # (6, 256), strided
    with torch.no_grad():
        got = layer(x)
    torch.testing.assert_close(got.double(), _exact(x, layer), rtol=1e-5, atol=1e-4)
    assert weights_seen == [True]


def test_torch_compile_of_a_packed_layer_is_one_graph_of_f_linear():
    """A model loaded for inference has packed weights; compiling it must not break the graph at each
    layer on the packed copy's checks (data pointers, which torch.compile cannot trace)."""
    seen = []

    def record(graph, example_inputs):
        seen.extend(str(node.target) for node in graph.graph.nodes)
        return graph.forward

    layer = _layer()
    assert layer.pack_for_inference()
    compiled = torch.compile(layer, backend=record, fullgraph=True)  # fullgraph: a break is an error
    x = torch.randn(4, 256)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x).double(), _exact(x, layer), rtol=1e-5, atol=1e-4)
    assert "<built-in function linear>" in seen, seen


def test_a_layer_made_under_inference_mode_stays_unpacked():
    """Inference tensors have no version counter, by which a packed copy is retired when the weight
    changes: such a weight is not packed (it used to raise "Inference tensors do not track version
    counter"), and the layer multiplies as before."""
    with torch.inference_mode():
        layer = _layer()
        assert not layer.pack_for_inference()
        assert pack_for_inference(torch.nn.Sequential(layer)) == 0
        x = torch.randn(5, 256)
        torch.testing.assert_close(layer(x).double(), _exact(x, layer), rtol=1e-5, atol=1e-4)
