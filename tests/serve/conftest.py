"""What the server's tests share: a small trained translation model."""

import pytest

from attnkit.config import load_run_config
from attnkit.train.loop import Trainer


@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """A small dates model (not perfect: its outputs must only be the CLI's)."""
    folder = tmp_path_factory.mktemp("run")
    config = load_run_config(None, [
        "model.preset=tiny", "data.task=dates", "data.tokenizer=char", "data.n_train=2000", "data.n_valid=20",
        "train.max_tokens=2000", "train.schedule=constant", "train.lr=0.002", "train.warmup=1",
        "train.max_steps=120", "train.eval_every=120", "decode.beam_size=4",
    ])  # fmt: skip
    Trainer(config, folder, echo=lambda message: None).fit()
    return folder
