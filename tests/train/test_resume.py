"""An interrupted and resumed run is the run that was not interrupted (CPU, fixed seed)."""

import pytest
import torch
from safetensors.torch import load_file

from attnkit.checkpoint.folder import resolve_checkpoint
from attnkit.config import load_run_config
from attnkit.train.loop import Trainer

SETTINGS = [
    "model.preset=tiny", "model.dropout=0.1", "data.task=dates", "data.tokenizer=char",
    "data.n_train=60", "data.n_valid=10", "train.max_tokens=300", "train.update_freq=2",
    "train.schedule=inverse_sqrt", "train.lr=0.003", "train.warmup=4", "train.eval_every=3",
    "train.label_smoothing=0.1", "train.clip_norm=1.0",
    "train.precision=fp32",  # told, not timed: two runs timed apart may choose apart on a busy machine
]  # fmt: skip


# An RNN whose attention is sampled: the draws, and the REINFORCE baseline, must resume too.
HARD_RNN = ["model.arch=rnn", "model.preset=rnn-tiny", "model.attention=general", "model.hard=true",
            "model.dropout=0.1"]  # fmt: skip


def _run(run_dir, max_steps, resume=False, model=()):
    settings = [s for s in SETTINGS if not (model and s.startswith("model."))]  # a model: all its own fields
    config = load_run_config(None, [*settings, *model, f"train.max_steps={max_steps}"])
    trainer = Trainer(config, run_dir, resume=resume, echo=lambda message: None)
    trainer.fit()
    return trainer


# The glimpse model samples where it looks, on canvases drawn afresh every epoch: both must resume.
GLIMPSE = ["model.arch=glimpse", "model.preset=ram-tiny", "model.glimpses=3", "data.task=cluttered-digits",
           "data.canvas=24", "train.batch_size=8", "train.eval_metric=accuracy"]  # fmt: skip


@pytest.mark.parametrize(
    "model", [(), HARD_RNN, GLIMPSE], ids=["transformer", "rnn-hard-attention", "glimpse"]
)
def test_resumed_run_has_the_same_losses_and_weights_as_an_uninterrupted_one(tmp_path, model):
    whole = _run(tmp_path / "whole", 9, model=model).state  # where each run ended
    _run(tmp_path / "split", 3, model=model)
    resumed = _run(tmp_path / "split", 9, resume=True, model=model).state
    assert whole.epoch >= 1  # the runs cross an epoch boundary (reshuffled batches)
    assert [row["train_loss"] for row in resumed.history] == [row["train_loss"] for row in whole.history]
    assert [row["valid_loss"] for row in resumed.history] == [row["valid_loss"] for row in whole.history]
    a = load_file(str(resolve_checkpoint(tmp_path / "whole", "last") / "model.safetensors"))
    b = load_file(str(resolve_checkpoint(tmp_path / "split", "last") / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = (tmp_path / "split" / "metrics.csv").read_text(encoding="utf-8").splitlines()
    assert len(rows) == 1 + 3  # header + validations at steps 3, 6, 9


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path):
    from attnkit.errors import AttnkitError

    with pytest.raises(AttnkitError, match="no checkpoint here"):
        _run(tmp_path / "empty", 3, resume=True)


def test_a_resumed_image_run_keeps_its_canvas(tmp_path):
    """The image size is filled in from data.canvas, so a resumed run may not change the canvas."""
    from attnkit.errors import ConfigError

    _run(tmp_path / "run", 3, model=GLIMPSE)
    with pytest.raises(ConfigError, match=r"data\.canvas=28 \(the run has 24\)"):
        _run(tmp_path / "run", 6, resume=True, model=[*GLIMPSE, "data.canvas=28"])
