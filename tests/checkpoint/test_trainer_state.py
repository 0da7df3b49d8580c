"""The trainer's state is saved whole and read back whole: every field of :class:`TrainerState`, the
optimizer's state and the random states; a file that lacks a field is a one-line error naming it."""

import json

import pytest
import torch

from attnkit.checkpoint.trainer_state import TrainerState, load_trainer_state, rng_state, write_trainer_state
from attnkit.errors import AttnkitError


def _optimizer() -> torch.optim.Optimizer:
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    layer(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return optimizer


def test_every_field_of_the_trainer_state_comes_back(tmp_path):
    state = TrainerState(step=12, epoch=2, position=5, elapsed=81.5, best=-1.25, bad_evals=1,
                         history=[{"step": 6, "valid_loss": 1.5}, {"step": 12, "valid_loss": 1.25}],
                         scheduler={"last_epoch": 12, "base_lrs": [1.0]})  # fmt: skip
    write_trainer_state(tmp_path, _optimizer(), state, [rng_state(), rng_state()])
    read, saved_by = load_trainer_state(tmp_path, _optimizer())
    assert read == state and saved_by == 2  # two processes' random states were saved


def test_a_state_missing_a_field_is_a_one_line_error_naming_the_folder(tmp_path):
    write_trainer_state(tmp_path, _optimizer(), TrainerState(step=3), [rng_state()])
    meta = json.loads((tmp_path / "trainer_state.json").read_text(encoding="utf-8"))
    del meta["position"]
    (tmp_path / "trainer_state.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(AttnkitError, match=r"trainer state does not fit .*'position'") as error:
        load_trainer_state(tmp_path, _optimizer())
    assert str(tmp_path) in str(error.value) and "\n" not in str(error.value)
