"""attnkit's linear map (oneDNN on CPU) equals ``F.linear`` in float64, in values and gradients."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnkit.cpu.linear import ENOUGH_WEIGHTS, linear, onednn_applies
from attnkit.cpu.linear import OneDNNLinear as Linear

onednn = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and onednn_applies(torch.ones(1, 512), torch.ones(1024, 512))),
    reason="this torch build has no oneDNN linear: attnkit uses F.linear, which other tests cover",
)


def _float64_reference(x, weight, bias, dy):
    """Output and gradients of ``F.linear`` in float64."""
    leaves = [t.detach().double().requires_grad_() for t in (x, weight, bias) if t is not None]
    y = F.linear(*leaves)
    y.backward(dy.double())
    return y, [t.grad for t in leaves]


@onednn
@pytest.mark.parametrize("shape", [(1, 512), (3, 512), (2, 7, 512), (2, 3, 5, 512), (67, 512), (5, 201, 512)])
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linear_equals_float64_linear_with_gradients(shape, bias):
    """Also for row counts that the kernel pads (67 -> 68 rows, 1,005 -> 1,008): the padding is cut off."""
    torch.manual_seed(0)
    weight = (torch.randn(1024, 512) * 0.05).requires_grad_()
    b = torch.randn(1024).requires_grad_() if bias else None
    x = torch.randn(*shape).requires_grad_()
    assert onednn_applies(x, weight)
    y = linear(x, weight, b)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref, ref_grads = _float64_reference(x, weight, b, dy)
    torch.testing.assert_close(y, ref.float(), atol=1e-5, rtol=1e-5)
    for got, want in zip([x.grad, weight.grad] + ([b.grad] if bias else []), ref_grads, strict=True):
        torch.testing.assert_close(got, want.float(), atol=1e-4, rtol=1e-5)


@onednn
def test_onednn_linear_reads_non_contiguous_input():
    torch.manual_seed(0)
    x = torch.randn(512, 6).t()  # (6, 512), strided
    weight = torch.randn(1024, 512) * 0.05
    want = F.linear(x.double(), weight.double()).float()
    torch.testing.assert_close(linear(x, weight), want, atol=1e-5, rtol=1e-5)


@onednn
@pytest.mark.parametrize("trained", ["input", "weight"])
def test_onednn_linear_gives_gradients_only_to_what_is_trained(trained):
    """A frozen layer (fine-tuning) still passes gradients back; a frozen input gets none."""
    torch.manual_seed(0)
    x = torch.randn(4, 512, requires_grad=trained == "input")
    weight = (torch.randn(1024, 512) * 0.05).requires_grad_(trained == "weight")
    linear(x, weight).sum().backward()
    assert (x.grad is not None, weight.grad is not None) == (trained == "input", trained == "weight")
    leaf, other = (x, weight) if trained == "input" else (weight, x)
    expected = torch.ones(4, 1024) @ weight.detach() if trained == "input" else torch.ones(1024, 4) @ x
    torch.testing.assert_close(leaf.grad, expected, atol=1e-4, rtol=1e-5)
    assert other.grad is None


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # torch says so whenever the flags are set
def test_small_float64_autocast_and_switched_off_multiplies_use_f_linear():
    big_x, big_w = torch.ones(4, 512), torch.ones(1024, 512)
    assert big_w.numel() >= ENOUGH_WEIGHTS
    assert not onednn_applies(torch.ones(2, 16), torch.ones(8, 16))  # too small to pay
    assert not onednn_applies(torch.ones(4096, 256), torch.ones(256, 256))  # many rows, small weight
    assert not onednn_applies(big_x.double(), big_w.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_applies(big_x, big_w)
        assert linear(big_x, big_w).dtype == torch.bfloat16  # autocast still applies, through F.linear
    with torch.backends.mkldnn.flags(enabled=False):
        assert not onednn_applies(big_x, big_w)
        x, w = torch.randn(4, 512), torch.randn(1024, 512)
        assert torch.equal(linear(x, w), F.linear(x, w))


def test_linear_module_is_nn_linear_with_the_same_state_dict():
    torch.manual_seed(0)
    ours = Linear(512, 1024)
    torch.manual_seed(0)
    peer = nn.Linear(512, 1024)
    assert isinstance(ours, nn.Linear)
    assert ours.state_dict().keys() == peer.state_dict().keys()
    for name, tensor in peer.state_dict().items():
        assert torch.equal(ours.state_dict()[name], tensor)  # the same initialisation
    x = torch.randn(3, 512)
    torch.testing.assert_close(ours(x), peer(x), atol=1e-5, rtol=1e-5)


@onednn
def test_under_torch_compile_the_graph_holds_f_linear_not_the_onednn_call():
    """torch.compile's CPU backend cannot lower the oneDNN call as attnkit makes it; it gets F.linear."""
    seen = []

    def record(graph, example_inputs):
        seen.extend(str(node.target) for node in graph.graph.nodes)
        return graph.forward

    layer = Linear(512, 1024)
    compiled = torch.compile(layer, backend=record, fullgraph=True)
    x = torch.randn(4, 512)
    torch.testing.assert_close(compiled(x), F.linear(x, layer.weight, layer.bias))
    assert "<built-in function linear>" in seen, seen  # not attnkit's autograd.Function around oneDNN
    assert not any("autograd_function" in target or "mkldnn" in target for target in seen), seen
