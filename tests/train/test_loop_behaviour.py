"""The loop stops early without improvement, stops clearly on a non-finite loss, runs under bf16
autocast, and reports the pairs it drops."""

import pytest
import torch

from attnkit.config import load_run_config
from attnkit.errors import AttnkitError, ConfigError
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
    assert trainer.state.step == 6  # best at step 2, no improvement at 4 and 6
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

    monkeypatch.setattr(translation, "translate", recording_translate)  # the search the task decodes with
    full, _ = _trainer(tmp_path / "full", "train.max_steps=1")
    limited, _ = _trainer(tmp_path / "limited", "train.max_steps=1", "train.valid_bleu_sentences=3")
    full_scores, limited_scores = full.validate(), limited.validate()
    assert decoded == [full.task.data.valid.src, full.task.data.valid.src[:3]]
    assert limited_scores["valid_loss"] == pytest.approx(full_scores["valid_loss"])  # same weights, all pairs


def test_frozen_parameters_keep_their_values_and_get_no_optimizer_state(tmp_path):
    frozen = ("src_embed.", "encoder.layers.0.")  # the tiny preset ties the output layer to src_embed
    trainer, messages = _trainer(tmp_path, "train.lr=0.003", "train.max_steps=3", "train.eval_every=3",
                                 "train.freeze=[src_embed, encoder.layers.0]")  # fmt: skip
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.fit()
    after = dict(trainer.model.named_parameters())
    kept = [name for name in before if name.startswith(frozen)]
    trained = [name for name in before if not name.startswith(frozen)]
    assert kept and all(torch.equal(before[name], after[name]) for name in kept)
    assert all(not after[name].requires_grad and after[name] not in trainer.optimizer.state for name in kept)
    assert sum(not torch.equal(before[name], after[name]) for name in trained) == len(trained)
    count = sum(after[name].numel() for name in kept)
    assert f"frozen: {count:,} parameters (src_embed, encoder.layers.0)" in messages


def test_a_freeze_prefix_must_name_whole_parts_of_parameter_names(tmp_path):
    with pytest.raises(ConfigError, match=r"train.freeze: no parameter is named 'encoder.layer' or starts "
                                          r"with 'encoder.layer\.'; .* start with .*encoder"):  # fmt: skip
        # "encoder.layer" begins "encoder.layers.0" as a string, but names no part of it
        _trainer(tmp_path, "train.max_steps=1", "train.freeze=[encoder.layer]")
    with pytest.raises(ConfigError, match=r"train\.freeze must list parameter name prefixes"):
        _trainer(tmp_path, "train.max_steps=1", "train.freeze=['']")


def test_a_resumed_run_keeps_what_it_froze(tmp_path):
    trainer, _ = _trainer(tmp_path, "train.max_steps=2", "train.eval_every=2", "train.freeze=[src_embed]")
    trainer.fit()
    config = load_run_config(None, [*TINY, "train.max_steps=4", "train.freeze=[]"])
    with pytest.raises(ConfigError, match=r"train.freeze=\[\] \(the run has \['src_embed'\]\)"):
        Trainer(config, tmp_path / "run", resume=True, echo=lambda m: None)


def test_the_trainer_trains_the_task_it_is_handed(tmp_path):
    """A task of the user's own (here translation with its loss doubled) trains through the same loop:
    the trainer calls what it is handed, and the data.task table is only the default."""
    calls = []

    class DoubledLoss(translation.TranslationTask):
        def loss(self, model, batch):
            calls.append(batch.n_tokens)
            loss, nll = super().loss(model, batch)
            return 2 * loss, nll

    config = load_run_config(None, [*TINY, "train.max_steps=2", "train.eval_every=2"])
    trainer = Trainer(config, tmp_path / "run", echo=lambda m: None, task=DoubledLoss)
    assert type(trainer.task) is DoubledLoss
    trainer.fit()
    assert len(calls) >= 2 and trainer.state.step == 2
    default, _ = _trainer(tmp_path / "default", "train.max_steps=1")
    assert type(default.task) is translation.TranslationTask
