"""attnkit.cpu.speed_up: applied to a built model from outside, it keeps every parameter and
state-dict key, computes what the paper's modules compute (forward and backward), and each fast path
it takes has a fallback that gives the same outputs when the fast path is not there."""

import threading

import pytest
import torch
from torch import nn

import attnkit.cpu.linear as cpu_linear
from attnkit.attention import MultiHeadAttention
from attnkit.cpu import Speedups, quantize_int8, speed_up
from attnkit.cpu.attention import CPUMultiHeadAttention
from attnkit.cpu.dropout import FastDropout
from attnkit.cpu.linear import OneDNNLinear
from attnkit.cpu.packing import PackedEncoder
from attnkit.models import ARCHITECTURES, build_model
from attnkit.models.config import DecoderModelConfig, EncoderModelConfig, TransformerConfig
from attnkit.nn import Encoder

# big enough that oneDNN takes every projection (weights of 2^17 numbers and more: cpu/linear.py)
SIZE = {"d_model": 256, "d_ff": 512, "h": 4, "dropout": 0.1, "attention_dropout": 0.1}
VOCAB = 600
needs_onednn = pytest.mark.skipif(cpu_linear._onednn_linear is None, reason="this torch has no oneDNN linear")


def _models() -> dict[str, tuple[nn.Module, tuple]]:
    """A small model of each Transformer architecture, with a padded batch for it."""
    torch.manual_seed(0)
    ids = torch.randint(4, VOCAB, (3, 12))
    ids[1, 9:], ids[2, 5:] = 0, 0  # padding (pad_id 0)
    tgt = torch.randint(4, VOCAB, (3, 7))
    return {
        "encoder-decoder": (
            build_model(TransformerConfig(encoder_layers=2, decoder_layers=2, **SIZE), VOCAB),
            (ids, tgt),
        ),
        "decoder": (build_model(DecoderModelConfig(layers=2, **SIZE), VOCAB), (ids, ids != 0)),
        "encoder": (build_model(EncoderModelConfig(layers=2, head="mlm", **SIZE), VOCAB), (ids,)),
    }


def _valid_positions(name: str, inputs: tuple) -> torch.Tensor:
    """The output positions that padding does not touch (padded positions' outputs are read by nothing)."""
    return torch.ones_like(inputs[1], dtype=torch.bool) if name == "encoder-decoder" else inputs[0] != 0


def test_every_architecture_keeps_its_parameters_and_state_dict_keys():
    for name, record in ARCHITECTURES.items():
        model = build_model(record.config(), 50 if record.has_vocabulary else None)
        before = {key: value.data_ptr() for key, value in model.state_dict().items()}
        done = speed_up(model)
        assert {key: value.data_ptr() for key, value in model.state_dict().items()} == before, name
        assert not any(
            type(m) in (nn.Linear, nn.Dropout, MultiHeadAttention, Encoder) for m in model.modules()
        )
        assert not speed_up(model), "a second call changes nothing more"
        if record.config.ARCH in ("encoder-decoder", "decoder", "encoder"):
            assert done.attention > 0 and done.encoders == 1, (name, done)


@needs_onednn
@pytest.mark.parametrize("name", ["encoder-decoder", "decoder", "encoder"])
def test_a_sped_up_model_computes_what_the_papers_modules_compute(name):
    """Every projection through oneDNN, encoders on packed rows, the attention's own slices of in_proj
    through oneDNN: the same outputs at every position padding does not touch, and the same gradients
    (dropout off on both sides: the two draw their masks differently)."""
    plain, inputs = _models()[name]
    fast, _ = _models()[name]
    done = speed_up(fast)
    assert done.linear >= 8 and done.encoders == 1
    assert sum(isinstance(m, PackedEncoder) for m in fast.modules()) == 1  # (a GPT's stack too)
    assert all(type(m) is OneDNNLinear for m in fast.modules() if isinstance(m, nn.Linear))
    plain.eval(), fast.eval()
    valid = _valid_positions(name, inputs)
    out_plain, out_fast = plain(*inputs), fast(*inputs)
    torch.testing.assert_close(out_fast[valid], out_plain[valid], atol=1e-4, rtol=1e-4)
    out_plain[valid].square().mean().backward()
    out_fast[valid].square().mean().backward()
    for (key, a), b in zip(plain.named_parameters(), fast.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-3, msg=key)


@needs_onednn
def test_inference_packs_the_weights_and_gives_the_same_outputs():
    plain, (ids, tgt) = _models()["encoder-decoder"]
    fast, _ = _models()["encoder-decoder"]
    plain.eval(), fast.eval()
    assert speed_up(fast, inference=True).packed_weights >= 8
    with torch.no_grad():
        torch.testing.assert_close(fast(ids, tgt), plain(ids, tgt), atol=1e-4, rtol=1e-4)


def test_without_onednn_nothing_is_swapped_for_the_linear_maps(monkeypatch):
    """The fallback of the oneDNN linear: where the probe found none, linear layers stay nn.Linear,
    the attention's slices go through F.linear, and the outputs are the plain model's."""
    monkeypatch.setattr(cpu_linear, "_onednn_linear", None)
    plain, (ids, tgt) = _models()["encoder-decoder"]
    fast, _ = _models()["encoder-decoder"]
    plain.eval(), fast.eval()
    done = speed_up(fast, inference=True)
    assert done.linear == 0 and done.packed_weights == 0 and done.encoders == 1
    assert any(type(m) is nn.Linear for m in fast.modules())
    with torch.no_grad():
        torch.testing.assert_close(fast(ids, tgt), plain(ids, tgt), atol=1e-5, rtol=1e-5)


@needs_onednn
def test_where_packed_weights_do_not_work_the_plain_ones_serve(monkeypatch):
    monkeypatch.setattr(cpu_linear, "_packing_works", lambda dtype=None: False)
    plain, (ids, tgt) = _models()["encoder-decoder"]
    fast, _ = _models()["encoder-decoder"]
    plain.eval(), fast.eval()
    done = speed_up(fast, inference=True)
    assert done.linear > 0 and done.packed_weights == 0
    with torch.no_grad():
        torch.testing.assert_close(fast(ids, tgt), plain(ids, tgt), atol=1e-4, rtol=1e-4)


def test_the_probes_find_the_fast_paths_here_and_none_without_onednn(monkeypatch):
    if torch.backends.mkldnn.is_available():
        assert cpu_linear._probe_linear() is not None and cpu_linear._packing_works()
    assert cpu_linear._probe_int_mm() in (True, False)  # tried, not raised
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert cpu_linear._probe_linear() is None


def test_int8_without_int_mm_multiplies_the_same_int8_numbers(monkeypatch):
    """The fallback of ``torch._int_mm`` is the same int32 sum by public operations: equal outputs."""
    torch.manual_seed(1)
    fast = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 40))
    slow = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 40))
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(20, 64)
    assert quantize_int8(fast) == 2
    cpu_linear._probe_int_mm.cache_clear()
    monkeypatch.setattr(cpu_linear, "_probe_int_mm", lambda: False)
    assert quantize_int8(slow) == 2
    assert slow[0].int8_product is cpu_linear._int32_product
    with torch.no_grad():
        assert torch.equal(fast(x), slow(x))
        torch.testing.assert_close(fast(x), nn.functional.linear(
            torch.relu(nn.functional.linear(x, fast[0].weight, fast[0].bias)), fast[2].weight, fast[2].bias
        ), atol=0.05, rtol=0.05)  # fmt: skip


def test_a_model_on_another_device_is_left_as_it_is():
    model, _ = _models()["decoder"]
    model = model.to("meta")
    assert speed_up(model) == Speedups() and not speed_up(model)
    assert any(type(m) is nn.Linear for m in model.modules())


def test_the_fast_dropout_and_attention_take_their_places_in_training():
    model, (ids, _) = _models()["decoder"]
    speed_up(model)
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(type(m) is FastDropout for m in dropouts)
    attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert attention and all(type(m) is CPUMultiHeadAttention for m in attention)
    model.train()
    torch.manual_seed(3)
    first = model(ids, ids != 0)
    torch.manual_seed(3)
    assert torch.equal(model(ids, ids != 0), first)  # its masks come from torch's generator: seeded
    torch.manual_seed(4)
    assert not torch.equal(model(ids, ids != 0), first)


def test_encoders_in_several_threads_each_pack_their_own_batch():
    """The packing is the running thread's own (a ContextVar): two threads encoding batches with
    different padding at once each get what their batch gives alone."""
    model, _ = _models()["encoder"]
    speed_up(model)
    model.eval()
    torch.manual_seed(5)
    batches = []
    for padded_from in (3, 9):
        ids = torch.randint(4, VOCAB, (4, 16))
        ids[::2, padded_from:] = 0
        batches.append(ids)
    with torch.no_grad():
        alone = [model.encode(ids) for ids in batches]
    results: dict[int, list[torch.Tensor]] = {0: [], 1: []}

    def work(i: int) -> None:
        with torch.no_grad():
            for _ in range(20):
                results[i].append(model.encode(batches[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in (0, 1):
        assert len(results[i]) == 20
        for out in results[i]:
            torch.testing.assert_close(out, alone[i])


def _fused_kernel_dtypes(monkeypatch) -> list[torch.dtype]:
    """The dtypes torch's fused attention kernel is called with, from here on."""
    seen, real = [], torch.nn.functional.scaled_dot_product_attention

    def spy(q, *args, **kwargs):
        seen.append(q.dtype)
        return real(q, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return seen


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["fused kernel", "dropout on the weights"])
def test_under_bf16_autocast_training_runs_the_fused_attention_kernel_in_float32(monkeypatch, dropout):
    """The fused kernel's CPU backward is several times slower in bf16 than in float32, so the CPU fast
    path trains attention between positions in float32 (the projections stay bf16); the paper's module
    leaves it to autocast (bf16), and the reference path (dropout on the weights) keeps bf16 too."""
    torch.manual_seed(0)
    paper = MultiHeadAttention(64, 4, dropout=dropout).train()
    fast = MultiHeadAttention(64, 4, dropout=dropout).train()
    fast.load_state_dict(paper.state_dict())
    speed_up(fast)
    assert isinstance(fast, CPUMultiHeadAttention)
    x = torch.randn(3, 7, 64, requires_grad=True)
    seen = _fused_kernel_dtypes(monkeypatch)
    outputs = {}
    for name, module in (("paper", paper), ("fast", fast)):
        with torch.autocast("cpu", torch.bfloat16):
            out, _ = module(x)
        assert out.dtype == torch.bfloat16  # W^O under autocast, as before
        outputs[name] = out
        out.float().sum().backward()
    if dropout:  # the reference path on both: no fused kernel
        assert seen == []
    else:
        assert seen == [torch.bfloat16, torch.float32]  # the paper's module, then the CPU fast path's
        torch.testing.assert_close(outputs["fast"], outputs["paper"], atol=0.05, rtol=0.05)
    seen.clear()
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):  # not training: as autocast says
        fast.eval()(x)
    assert seen == [torch.bfloat16]
