"""What a run's config must hold before training starts (a limit, a schedule's length, its data's
files), what a resumed run may change of the run it continues, and the shape a fine-tuned run takes
from the model it starts from: checked in one call, before any data is read."""

from __future__ import annotations

import copy
from pathlib import Path

from attnkit.checkpoint.folder import read_run_config
from attnkit.config import RunConfig
from attnkit.errors import ConfigError
from attnkit.train.pretrained import Pretrained, read_pretrained
from attnkit.train.tensorboard import require_tensorboard


def ready_to_train(config: RunConfig, resume_from: Path | None) -> tuple[RunConfig, Pretrained | None]:
    """A copy of ``config`` (the caller's stays as it was) checked for what training needs before any
    data is read, with ``data.dir`` resolved so that ``--resume`` works from any working directory; and
    where the run starts: a resumed run (``resume_from``, its checkpoint) checked against the run it
    continues, a new one with ``train.init_from`` given the pretrained model's shape (returned too)."""
    config = copy.deepcopy(config)
    t = config.train
    if not (t.max_steps or t.max_epochs or t.max_minutes):
        raise ConfigError("set at least one of train.max_steps, train.max_epochs, train.max_minutes")
    if t.schedule == "cosine" and not (t.decay_steps or t.max_steps):
        raise ConfigError("train.schedule='cosine' decays over train.decay_steps or train.max_steps: set one")
    config.data.check_files_given()
    config.data.dir = str(Path(config.data.dir).resolve())
    if "tensorboard" in t.log:
        require_tensorboard()
    if resume_from is not None:
        check_resumable(read_run_config(resume_from), config)
        return config, None
    pretrained = read_pretrained(t.init_from) if t.init_from else None
    if pretrained is not None:
        config.model = pretrained.shape_for(config.model)
    return config, pretrained


# num_labels, image_size: a classifier's labels and an image model's size come from its data (data.labels,
# data.canvas), which the run keeps
RESUMABLE_MODEL_CHANGES = {"dropout", "attention_dropout", "activation_dropout", "num_labels", "image_size"}


def check_resumable(saved: RunConfig, config: RunConfig) -> None:
    """A resumed run keeps its model and vocabulary: only dropout rates (and training and decoding
    settings) may change, since other model fields (``activation``, ``norm_first``, the position layout)
    would change the model silently, without any weight changing shape."""
    changed = [
        f"model.{name}={getattr(config.model, name)!r} (the run has {value!r})"
        for name, value in vars(saved.model).items()
        if name not in RESUMABLE_MODEL_CHANGES and getattr(config.model, name) != value
    ]
    changed += [
        f"data.{name}={getattr(config.data, name)!r} (the run has {getattr(saved.data, name)!r})"
        for name in ("tokenizer", "vocab_size", "canvas")
        if getattr(config.data, name) != getattr(saved.data, name)
    ]
    if config.train.freeze != saved.train.freeze:  # the optimizer's state covers the trained ones only
        changed.append(f"train.freeze={config.train.freeze!r} (the run has {saved.train.freeze!r})")
    if changed:
        raise ConfigError(
            f"a resumed run keeps its model and vocabulary, but {', '.join(changed)}; start a new run instead"
        )
