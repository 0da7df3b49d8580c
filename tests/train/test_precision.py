"""train.precision resolved for the device, said in the run's first line and recorded in config.json:
explicit settings as given; auto bf16 autocast on a GPU and on a CPU whose bf16 matrix products are fast
where a training step is faster so (timed both ways on the first batch), float32 on a CPU without such
units, each saying why."""

import json

import pytest
import torch

from attnkit.config import load_run_config
from attnkit.cpu import precision as cpu_precision
from attnkit.train import precision
from attnkit.train.loop import Trainer
from attnkit.train.precision import training_precision

TINY = ["data.task=dates", "data.tokenizer=char", "data.n_train=40", "data.n_valid=4",
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


@pytest.mark.parametrize(("setting", "units", "bf16_from", "trains_in"),
                         [("auto", True, 0.0, "bf16"), ("auto", True, 1e9, "fp32"),
                          ("auto", False, 0.0, "fp32"), ("bf16", False, 1e9, "bf16"),
                          ("fp32", True, 0.0, "fp32")])  # fmt: skip
def test_a_run_says_its_precision_first_and_its_checkpoint_records_it(monkeypatch, tmp_path, setting, units,
                                                                      bf16_from, trains_in):  # fmt: skip
    """auto as this CPU's probe resolves it and the timed steps choose (both forced either way here,
    so that float32 and bf16 are both trained on any machine: ``bf16_from`` 0 takes bf16 at any
    speed, 1e9 never), recorded as the precision it resolved to."""
    monkeypatch.setattr(precision, "matrix_units", lambda: _units(units))
    monkeypatch.setattr(precision, "BF16_AT_LEAST", bf16_from)
    messages = []
    config = load_run_config(None, [*TINY, "model.preset=tiny", f"train.precision={setting}"])
    trainer = Trainer(config, tmp_path / "run", echo=messages.append)
    said = [message for message in messages if message.startswith("precision: ")]
    timed = setting == "auto" and units
    assert messages[0] == said[0] and len(said) == 1 + timed
    assert said[-1].startswith("precision: " + ("fp32" if trains_in == "fp32" else "bf16 autocast"))
    assert ("a training step of the first batch took" in said[-1]) is timed
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


def test_a_step_timed_both_ways_keeps_bf16_only_where_it_is_clearly_faster(monkeypatch):
    """faster_of_two on a clock that each step moves by its given time: bf16 from BF16_AT_LEAST times
    float32's speed; the first step each way (warming up) is not counted."""
    clock = [0.0]
    monkeypatch.setattr(precision.time, "perf_counter", lambda: clock[0])

    def steps(fp32_s: float, bf16_s: float, first_s: float = 100.0):
        calls = []

        def step(autocast):
            with autocast():
                in_bf16 = torch.is_autocast_enabled("cpu")
            calls.append(in_bf16)
            clock[0] += first_s if len(calls) <= 2 else (bf16_s if in_bf16 else fp32_s)

        return step, calls

    step, calls = steps(fp32_s=1.0, bf16_s=0.5)
    dtype, says = precision.faster_of_two(step)
    assert dtype == torch.bfloat16 and says.startswith("bf16 autocast (train.precision=auto: a training step")
    assert "500.0 ms in bf16 against 1000.0 ms in float32" in says
    assert calls == [False, True] * (precision.TIMED_STEPS + 1)  # alternated
    for fp32_s, chosen in ((1.05, None), (precision.BF16_AT_LEAST, torch.bfloat16), (0.8, None)):
        assert precision.faster_of_two(steps(fp32_s=fp32_s, bf16_s=1.0)[0])[0] == chosen


def test_only_auto_on_a_cpu_with_bf16_units_in_one_process_is_timed():
    cpu = torch.device("cpu")
    assert precision.measured_on("auto", cpu, torch.bfloat16, 1)
    assert not precision.measured_on("auto", cpu, None, 1)  # no fast bf16 units
    assert not precision.measured_on("bf16", cpu, torch.bfloat16, 1)  # told
    assert not precision.measured_on("auto", cpu, torch.bfloat16, 2)  # the processes would have to agree
    assert not precision.measured_on("auto", torch.device("cuda"), torch.bfloat16, 1)


HARD_RNN = [
    "model.arch=rnn",
    "model.d_embed=16",
    "model.d_hidden=32",
    "model.attention=general",
    "model.hard=true",
]


@pytest.mark.parametrize(
    ("bf16_from", "model"),
    [(1e9, ["model.preset=tiny"]), (0.0, ["model.preset=tiny"]), (1e9, HARD_RNN)],
    ids=["timing chose fp32", "timing chose bf16", "hard attention's baseline, a buffer"],
)
def test_a_run_whose_timing_chose_trains_as_one_told_that_precision(monkeypatch, tmp_path, bf16_from, model):
    """The steps timed leave nothing behind: no gradient, the buffers as they were (REINFORCE's moving
    baseline moves at every training step), the dropout's generator seeded after them; the weights
    after three steps are those of a run told the precision chosen, bit for bit."""
    monkeypatch.setattr(precision, "matrix_units", lambda: _units(True))
    monkeypatch.setattr(precision, "BF16_AT_LEAST", bf16_from)
    chosen = "fp32" if bf16_from else "bf16"
    steps = [*TINY, *model, "train.max_steps=3", "model.dropout=0.3", "train.eval_every=3"]
    weights = {}
    for setting in ("auto", chosen):
        trainer = Trainer(load_run_config(None, [*steps, f"train.precision={setting}"]), tmp_path / setting,
                          echo=lambda message: None)  # fmt: skip
        assert trainer.config.train.precision == chosen
        trainer.fit()
        weights[setting] = {name: p.detach().clone() for name, p in trainer.model.state_dict().items()}
    assert weights["auto"].keys() == weights[chosen].keys()
    for name, tensor in weights["auto"].items():
        assert torch.equal(tensor, weights[chosen][name]), name


def test_the_timing_and_the_training_make_the_first_epochs_batches_once(monkeypatch, tmp_path):
    """The precision's timing batches epoch 0 for its step; the loop takes those batches rather than
    making them again (for a large data set, seconds at every start), and makes the next epoch's."""
    from attnkit.tasks.translation import TranslationTask

    monkeypatch.setattr(precision, "matrix_units", lambda: _units(True))
    made = []
    epoch_batches = TranslationTask.epoch_batches
    monkeypatch.setattr(TranslationTask, "epoch_batches",
                        lambda task, epoch: made.append(epoch) or epoch_batches(task, epoch))  # fmt: skip
    settings = [*TINY, "model.preset=tiny", "train.max_steps=99", "train.max_epochs=2"]  # (precision: auto)
    trainer = Trainer(load_run_config(None, settings), tmp_path / "run", echo=lambda message: None)
    trainer.fit()
    assert made == [0, 1]
