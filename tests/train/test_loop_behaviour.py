"""The loop stops early without improvement, stops clearly on a non-finite loss, runs under bf16
autocast, and reports the pairs it drops."""

import pytest
import torch

from attnkit.config import load_run_config
from attnkit.errors import AttnkitError
from attnkit.tasks import translation
from attnkit.tasks.translation import prepare_data
from attnkit.train.loop import Trainer

TINY = ["model.preset=tiny", "data.task=dates", "data.tokenizer=char", "data.n_train=80", "data.n_valid=8",
        "train.max_tokens=300", "train.schedule=constant", "train.warmup=1"]  # fmt: skip


def _trainer(tmp_path, *extra):
    messages = []
    config = load_run_config(None, [*TINY, *extra])
    return Trainer(config, tmp_path / "run", echo=messages.append), messages


def test_patience_stops_training_when_validation_does_not_improve(tmp_path):
    trainer, messages = _trainer(tmp_path, "train.lr=0.0", "train.eval_every=2", "train.patience=2",
                                 "train.max_steps=50", "train.eval_metric=loss")  # fmt: skip
    trainer.fit()
    assert trainer.step == 6  # best at step 2, no improvement at 4 and 6
    assert any("stopping early" in m for m in messages)


def test_a_non_finite_loss_stops_with_a_clear_message(tmp_path, monkeypatch):
    trainer, _ = _trainer(tmp_path, "train.lr=0.001", "train.max_steps=3")

    real_loss = trainer.task.loss

    def nan_loss(model, batch):
        loss, nll = real_loss(model, batch)
        return loss * float("nan"), nll

    monkeypatch.setattr(trainer.task, "loss", nan_loss)
    with pytest.raises(AttnkitError, match=r"loss became nan at step 1"):
        trainer.fit()


def test_bf16_autocast_trains_on_cpu(tmp_path):
    trainer, _ = _trainer(tmp_path, "train.lr=0.003", "train.max_steps=4", "train.eval_every=4",
                          "train.precision=bf16")  # fmt: skip
    assert trainer.autocast_dtype is torch.bfloat16
    scores = trainer.fit()
    assert torch.isfinite(torch.tensor(scores["valid_loss"]))


def test_over_long_pairs_are_dropped_together_and_counted():
    config = load_run_config(None, [*TINY, "data.max_len=12"]).data
    messages = []
    data = prepare_data(config, seed=1, echo=messages.append)
    assert all(
        len(s) + 1 <= 12 and len(t) + 1 <= 12 for s, t in zip(data.train_src, data.train_tgt, strict=True)
    )
    dropped = [m for m in messages if "longer than data.max_len=12" in m]
    assert dropped and int(dropped[0].split()[1]) == 80 - len(data.train_src) > 0


def test_valid_bleu_sentences_decodes_only_a_prefix_but_scores_loss_on_all(tmp_path, monkeypatch):
    decoded = []

    def recording_translate(model, tokenizer, texts, decode, **kwargs):
        decoded.append(list(texts))
        return list(texts)  # "perfect" translations of the source: scores are computed on these

    monkeypatch.setattr(translation, "translate", recording_translate)
    full, _ = _trainer(tmp_path / "full", "train.max_steps=1")
    limited, _ = _trainer(tmp_path / "limited", "train.max_steps=1", "train.valid_bleu_sentences=3")
    full_scores, limited_scores = full.validate(), limited.validate()
    assert decoded == [full.task.data.valid.src, full.task.data.valid.src[:3]]
    assert limited_scores["valid_loss"] == pytest.approx(full_scores["valid_loss"])  # same weights, all pairs
