"""The one loader of every command and the server (``attnkit.loading``): a checkpoint's model in the
precision asked for, its decode settings changed and checked, and ``auto`` precision by the CPU's bf16
units."""

import pytest
import torch

from attnkit import build_transformer
from attnkit.config import load_run_config
from attnkit.cpu.linear import BF16_MIN_WEIGHTS, _packing_works
from attnkit.errors import AttnkitError
from attnkit.loading import load_for_inference, ready_for_inference
from attnkit.models.config import TransformerConfig
from tests.runs import trained_dates


@pytest.fixture(scope="module")
def dates_run(tmp_path_factory):
    return trained_dates(tmp_path_factory.mktemp("dates"), "data.n_train=200", "data.n_valid=8",
                         "train.max_tokens=500", "train.max_steps=2", "train.eval_every=2")  # fmt: skip


def test_one_loader_applies_the_precision_and_decode_overrides_for_every_command_and_the_server(dates_run):
    """What the CLI and the server load a model with: decode settings changed and checked, and the linear
    maps in the precision asked for (int8 weights, bf16 or float32 packed copies; bf16 and int8 on a CPU
    only), which the config returned names."""
    int8 = ["decode.beam_size=2", "decode.precision=int8"]
    model, _, config = load_for_inference(dates_run, overrides=int8)
    assert config.decode.beam_size == 2 and config.decode.precision == "int8"
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.int8_weight is not None and m.packed_weight is None for m in linears)
    bf16, _, config = load_for_inference(dates_run, overrides=["decode.precision=bf16"])
    linears = [m for m in bf16.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.numel() < BF16_MIN_WEIGHTS for m in linears)  # a toy model's maps
    assert all(m.packed_dtype == torch.float32 and m.int8_weight is None for m in linears)
    assert config.decode.precision == "fp32"  # every map kept float32, and the config says so
    wider = build_transformer(TransformerConfig.from_preset("tiny", d_model=256, d_ff=1024), 50)
    config = load_run_config(None, ["decode.precision=bf16"])
    linears = [m for m in ready_for_inference(wider, config).modules() if isinstance(m, torch.nn.Linear)]
    if _packing_works(torch.bfloat16):
        wanted = [torch.bfloat16 if m.weight.numel() >= BF16_MIN_WEIGHTS else torch.float32 for m in linears]
        assert torch.bfloat16 in wanted and [m.packed_dtype for m in linears] == wanted  # small maps: float32
        assert config.decode.precision == "bf16"
    else:  # a CPU whose oneDNN packs no bf16 weights (AVX2): float32, and the config says so
        assert all(m.packed_dtype == torch.float32 for m in linears) and config.decode.precision == "fp32"
    packed, _, plain = load_for_inference(dates_run, overrides=["decode.precision=fp32"])
    assert plain.decode.beam_size == 4 and plain.decode.precision == "fp32"
    linears = [m for m in packed.modules() if isinstance(m, torch.nn.Linear)]
    assert all(m.int8_weight is None and m.packed_dtype == torch.float32 for m in linears)
    with pytest.raises(AttnkitError, match=r"decode\.beam_size must be >= 1"):
        load_for_inference(dates_run, overrides=["decode.beam_size=0"])
    with pytest.raises(AttnkitError, match=r"decode\.precision must be one of .*'bf16'.*; got 'fp16'"):
        load_for_inference(dates_run, overrides=["decode.precision=fp16"])
    for precision in ("int8", "bf16"):
        refused = rf"decode\.precision={precision} is for CPUs; this would run on cuda"
        with pytest.raises(AttnkitError, match=refused):
            load_for_inference(dates_run, "cuda", overrides=[f"decode.precision={precision}"])


def test_where_bf16_weights_cannot_be_packed_the_loader_says_float32(dates_run, monkeypatch):
    """The fallback: a torch whose oneDNN packs no bf16 weights serves float32, and the config says so."""
    from attnkit.cpu import linear

    monkeypatch.setattr(linear, "_packing_works", lambda dtype=torch.float32: dtype == torch.float32)
    model, _, config = load_for_inference(dates_run, overrides=["decode.precision=bf16"])
    assert config.decode.precision == "fp32"
    assert all(m.packed_dtype == torch.float32 for m in model.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize(("bf16_units", "resolved"), [(True, "bf16"), (False, "fp32")])
def test_auto_precision_follows_the_cpus_bf16_units_and_is_float32_on_a_gpu(monkeypatch, bf16_units,
                                                                             resolved):  # fmt: skip
    """decode.precision=auto: bf16 where the probe finds fast bf16 products (forced either way here, so
    that both are exercised on any machine), float32 where it does not and on a GPU; explicit settings as
    given, without probing."""
    from attnkit import loading
    from attnkit.cpu.precision import MatrixUnits

    units = MatrixUnits(bf16_units, 3.0 if bf16_units else 0.0, ("amx_bf16",) if bf16_units else (), ())
    monkeypatch.setattr(loading, "matrix_units", lambda: units)
    chosen, why = loading.inference_precision("auto", torch.device("cpu"))
    assert chosen == resolved and why.startswith("decode.precision=auto: this CPU has ")
    monkeypatch.setattr(loading, "matrix_units", lambda: pytest.fail("probed"))
    on_a_gpu = loading.inference_precision("auto", torch.device("cuda"))
    assert on_a_gpu == ("fp32", "decode.precision=auto on a CUDA")
    for given in ("fp32", "bf16", "int8"):
        assert loading.inference_precision(given, torch.device("cpu")) == (given, f"decode.precision={given}")
