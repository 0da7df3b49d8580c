"""train.log: [csv, tensorboard]: a run's event files, read back with TensorBoard's own reader, hold the
training points every log_every steps and every validation's scores (the same as metrics.csv), and
a resumed run continues them without drawing any step twice."""

import csv
import math

import pytest

from attnkit.config import load_run_config
from attnkit.errors import ConfigError
from attnkit.train.loop import Trainer

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator", reason="TensorBoard reads the event files"
)

SETTINGS = ["model.preset=tiny", "data.task=dates", "data.tokenizer=char", "data.n_train=300",
            "data.n_valid=8", "train.max_tokens=400", "train.log_every=2", "train.eval_every=3",
            "train.log=[csv, tensorboard]", "train.warmup=2", "train.clip_norm=1.0"]  # fmt: skip


def _scalars(run_dir):
    events = event_accumulator.EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_the_event_files_hold_the_training_points_and_every_validation(tmp_path):
    run = tmp_path / "run"
    Trainer(load_run_config(None, [*SETTINGS, "train.max_steps=6"]), run, echo=lambda m: None).fit()
    scalars = _scalars(run)
    for tag in ("train/loss", "train/lr", "train/tokens_per_s", "train/grad_norm"):
        assert [step for step, _ in scalars[tag]] == [2, 4, 6], tag
        assert all(math.isfinite(value) and value > 0 for _, value in scalars[tag]), tag
    rows = list(csv.DictReader((run / "metrics.csv").open(encoding="utf-8")))
    assert [int(row["step"]) for row in rows] == [3, 6]
    for name in ("loss", "bleu", "accuracy"):
        logged = scalars[f"valid/{name}"]
        assert [step for step, _ in logged] == [3, 6]
        for (_, value), row in zip(logged, rows, strict=True):
            assert value == pytest.approx(float(row[f"valid_{name}"]), rel=1e-6)  # float32 in the events
    assert [step for step, _ in scalars["memory/peak_rss_gb"]] == [3, 6]
    assert 0.05 < scalars["memory/peak_rss_gb"][-1][1] < 64


def test_a_resumed_run_continues_the_events_without_a_step_twice(tmp_path):
    """A run killed after logging step 4 resumes from its step-3 checkpoint: step 4's second point
    replaces the first (TensorBoard's purge), and every step is drawn once."""
    import json

    run = tmp_path / "run"
    Trainer(load_run_config(None, [*SETTINGS, "train.max_steps=5"]), run, echo=lambda m: None).fit()
    states = {p: p / "trainer_state.json" for p in run.iterdir() if (p / "trainer_state.json").is_file()}
    at_step_3 = next(p for p, s in states.items() if json.loads(s.read_text(encoding="utf-8"))["step"] == 3)
    (run / "last").write_text(at_step_3.name, encoding="utf-8")  # as if killed before the step-5 save
    first_step_4 = dict(_scalars(run)["train/loss"])[4]
    Trainer(
        load_run_config(None, [*SETTINGS, "train.max_steps=8"]), run, resume=True, echo=lambda m: None
    ).fit()
    scalars = _scalars(run)
    assert [step for step, _ in scalars["train/loss"]] == [2, 4, 6, 8]
    assert [step for step, _ in scalars["valid/loss"]] == [3, 6, 8]
    assert dict(scalars["train/loss"])[4] == pytest.approx(first_step_4, rel=1e-5)  # the same step again


def test_tensorboard_in_train_log_without_the_package_is_a_one_line_error(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith(("torch.utils.tensorboard", "tensorboard")):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(
        ConfigError, match=r"train\.log names tensorboard, but the tensorboard package is not"
    ):
        Trainer(
            load_run_config(None, [*SETTINGS, "train.max_steps=1"]), tmp_path / "run", echo=lambda m: None
        )
    assert not (tmp_path / "run").exists()  # before any data is read or the run directory made


def test_train_log_names_only_what_attnkit_writes():
    with pytest.raises(ConfigError, match=r"train\.log must be one of 'csv', 'tensorboard'; got 'wandb'"):
        load_run_config(None, ["train.log=[csv, wandb]"])
