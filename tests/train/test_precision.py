"""train.precision resolved for the device, said in the run's first line and recorded in config.json:
explicit settings as given; auto bf16 autocast on a GPU and on a CPU whose bf16 matrix products are fast,
float32 on a CPU without such units, each saying why."""

import json

import pytest
import torch

from attnkit.config import load_run_config
from attnkit.cpu import precision as cpu_precision
from attnkit.train import precision
from attnkit.train.loop import Trainer
from attnkit.train.precision import training_precision

TINY = ["model.preset=tiny", "data.task=dates", "data.tokenizer=char", "data.n_train=40", "data.n_valid=4",
        "train.max_tokens=300", "train.schedule=constant", "train.warmup=1", "train.max_steps=1"]  # fmt: skip


def _units(bf16: bool) -> cpu_precision.MatrixUnits:
    flags = ("amx_bf16",) if bf16 else ()
    return cpu_precision.MatrixUnits(bf16, 3.0 if bf16 else 0.0, flags, ())


@pytest.mark.parametrize(
    ("setting", "device", "dtype", "says"),
    [
        ("fp32", "cuda", None, "fp32 (train.precision=fp32)"),
        ("bf16", "cpu", torch.bfloat16, "bf16 autocast (train.precision=bf16)"),
        ("auto", "cuda", torch.bfloat16, "bf16 autocast (train.precision=auto: a GPU)"),
        ("auto", "mps", None, "fp32 (train.precision=auto on a MPS)"),
    ],
)
def test_explicit_settings_and_a_gpu_need_no_probe(monkeypatch, setting, device, dtype, says):
    monkeypatch.setattr(precision, "matrix_units", lambda: pytest.fail("probed"))
    assert training_precision(setting, torch.device(device)) == (dtype, says)


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16 units", "none"])
def test_auto_on_a_cpu_trains_in_bf16_where_its_units_are_fast_and_says_why(monkeypatch, bf16):
    monkeypatch.setattr(precision, "matrix_units", lambda: _units(bf16))
    dtype, says = training_precision("auto", torch.device("cpu"))
    assert dtype == (torch.bfloat16 if bf16 else None)
    expected = "bf16 autocast (train.precision=auto: " if bf16 else "fp32 (train.precision=auto: "
    assert says.startswith(expected)
    assert ("amx_bf16; a bf16 matrix product ran 3.0x" in says) is bf16
    assert ("no bf16 matrix instructions" in says) is not bf16


@pytest.mark.parametrize(("setting", "units", "trains_in"),
                         [("auto", True, "bf16"), ("auto", False, "fp32"), ("bf16", False, "bf16"),
                          ("fp32", True, "fp32")])  # fmt: skip
def test_a_run_says_its_precision_first_and_its_checkpoint_records_it(monkeypatch, tmp_path, setting, units,
                                                                      trains_in):  # fmt: skip
    """auto as this CPU's probe resolves it (forced either way here, so that float32 and bf16 are both
    trained on any machine), recorded as the precision it resolved to."""
    monkeypatch.setattr(precision, "matrix_units", lambda: _units(units))
    messages = []
    trainer = Trainer(load_run_config(None, [*TINY, f"train.precision={setting}"]), tmp_path / "run",
                      echo=messages.append)  # fmt: skip
    assert messages[0].startswith("precision: " + ("fp32" if trains_in == "fp32" else "bf16 autocast"))
    assert trainer.autocast_dtype == (None if trains_in == "fp32" else torch.bfloat16)
    trainer.fit()
    saved = json.loads((tmp_path / "run" / "step-0000001" / "config.json").read_text(encoding="utf-8"))
    assert saved["train"]["precision"] == trains_in


def test_auto_resolves_to_bf16_on_a_cpu_whose_probe_finds_fast_units():
    """The real probe, unpatched: auto follows it (bf16 on this project's machines, which have AMX)."""
    cpu_precision.matrix_units.cache_clear()
    units = cpu_precision.matrix_units()
    dtype, _ = training_precision("auto", torch.device("cpu"))
    assert dtype == (torch.bfloat16 if units.bf16 else None)
