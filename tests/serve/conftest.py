"""What the server's tests share: a small trained translation model."""

import pytest

from attnkit.config import load_run_config
from attnkit.train.loop import Trainer
from tests.runs import trained_dates


@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """A small dates model (not perfect: its outputs must only be the CLI's)."""
    return trained_dates(tmp_path_factory.mktemp("run"), "data.n_train=2000", "data.n_valid=20",
                         "train.max_tokens=2000", "train.schedule=constant", "train.lr=0.002",
                         "train.warmup=1", "train.max_steps=120", "train.eval_every=120")  # fmt: skip


@pytest.fixture(scope="session")
def decoder(tmp_path_factory):
    """A small character-level GPT on a few sentences (its continuations vary with the seed)."""
    folder = tmp_path_factory.mktemp("decoder")
    animals, places = ["cat", "dog", "hen", "fox"], ["mat", "log", "den", "box"]
    lines = [f"the {a} sat on the {p}.\n" for a in animals for p in places] * 20
    (folder / "text.txt").write_text("".join(lines), encoding="utf-8")
    config = load_run_config(None, [
        "model.arch=decoder", "model.preset=tiny-decoder", "data.task=text", f"data.dir={folder}",
        "data.train=[text.txt]", "data.tokenizer=char", "train.max_tokens=1024", "train.schedule=constant",
        "train.lr=0.003", "train.warmup=1", "train.max_steps=60", "train.eval_every=60",
        f"data.store={folder / 'stores'}",
    ])  # fmt: skip
    Trainer(config, folder / "run", echo=lambda message: None).fit()
    return folder / "run"
