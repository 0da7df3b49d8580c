"""Cluttered digits through the one training loop and CLI: the glimpse model and the whole-image network
learn, checkpoints hold no tokenizer, ``attnkit evaluate`` scores the held-out test digits and draws the
glimpse paths, and the task refuses a text model."""

import re

import pytest
from typer.testing import CliRunner

from attnkit.checkpoint.folder import resolve_checkpoint
from attnkit.cli import app
from attnkit.config import load_run_config
from attnkit.data.cluttered_digits import cluttered_digits
from attnkit.errors import ConfigError
from attnkit.loading import load_for_inference

pytest.importorskip("sklearn", reason="the cluttered-digits task draws scikit-learn's bundled digits")

# An easy version (a small canvas, no clutter) that a tiny model learns in seconds.
EASY = ["data.canvas=24", "data.clutter=0", "data.n_train=3000", "data.n_valid=300", "train.batch_size=32",
        "train.schedule=constant", "train.warmup=0", "train.lr=3e-3", "train.label_smoothing=0",
        "train.max_steps=1000", "train.eval_every=500"]  # fmt: skip
GLIMPSE = [
    "model.arch=glimpse",
    "model.d_glimpse=32",
    "model.d_hidden=64",
    "model.glimpses=3",
    "model.scales=2",
]


@pytest.mark.parametrize(
    "model", [GLIMPSE, ["model.arch=whole-image", "model.d_hidden=64"]], ids=["glimpse", "whole"]
)
def test_image_models_learn_cluttered_digits_and_are_evaluated_from_the_cli(tmp_path, model):
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--run-dir", str(run), *model, *EASY])
    assert result.exit_code == 0, result.output
    final = re.search(r"final validation: valid_loss [\d.]+, valid_accuracy ([\d.]+)", result.stdout)
    assert float(final.group(1)) >= 0.4, result.stdout  # chance: 0.1 (seeds 1-4 reach 0.55-0.71)
    checkpoint = resolve_checkpoint(run)
    assert not (checkpoint / "tokenizer.json").exists()
    loaded, tokenizer, config = load_for_inference(run)
    assert tokenizer is None and config.model.image_size == 24 and config.data.task == "cluttered-digits"
    plot = tmp_path / "glimpses.png"
    args = ["evaluate", "--ckpt", str(run)] + (["--plot", str(plot)] if "model.arch=glimpse" in model else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    accuracy = float(result.stdout.split()[1])
    assert accuracy >= 0.4 and "on 300 test images" in result.stdout
    if "model.arch=glimpse" in model:
        assert plot.stat().st_size > 10_000
        digits = cluttered_digits("test", 64, 24, 0, seed=0)  # where it looks next depends on what it saw:
        loaded.eval()(digits.images.unsqueeze(1).float() / 255)  # a policy blind to it has 0 spread here
        assert loaded.locations[:, 1:].std(0).mean() > 0.03  # (seeds 0-3: 0.09-0.25; noise images were
        # out of distribution, 0.01-0.10)
    result = CliRunner().invoke(app, ["average", "--run-dir", str(run), "--last", "2"])
    assert result.exit_code == 0, result.output  # averaging needs no tokenizer.json either
    result = CliRunner().invoke(app, ["evaluate", "--ckpt", str(run / "averaged")])
    assert result.exit_code == 0 and "test images" in result.stdout, result.output
    result = CliRunner().invoke(app, ["evaluate", "--ckpt", str(run), "--src", "x.txt", "--ref", "y.txt"])
    assert result.exit_code == 2 and "generated test images" in result.output


def test_the_image_task_needs_an_image_model():
    with pytest.raises(ConfigError, match="glimpse"):
        load_run_config(None, ["data.task=cluttered-digits"])
    config = load_run_config(None, ["model.arch=glimpse"])  # an image model's default task
    assert config.data.task == "cluttered-digits" and config.train.eval_metric == "accuracy"
    with pytest.raises(ConfigError, match=r"data\.canvas"):
        load_run_config(None, ["model.arch=glimpse", "data.canvas=8"])
