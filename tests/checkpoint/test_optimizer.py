"""The optimizer's state as a checkpoint holds it (checkpoint/optimizer.py): split into named tensors and
plain values, written as safetensors and JSON and loaded into a fresh optimizer, it takes the next step
exactly as the optimizer it came from (Adam's moments and step count, the groups' settings)."""

import json

import torch
from safetensors.torch import load_file, save_file

from attnkit.checkpoint.optimizer import load_state, optimizer_tensors, parameter_of, split_state


def _model_and_adam(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return model, torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.9, 0.98))


def _step(model, optimizer, seed):
    torch.manual_seed(100 + seed)
    optimizer.zero_grad()
    model(torch.randn(5, 4)).square().sum().backward()
    optimizer.step()


def test_the_state_written_and_loaded_takes_the_same_next_step(tmp_path):
    model, adam = _model_and_adam(0)
    for step in range(3):
        _step(model, adam, step)
    tensors, meta = split_state(adam)
    assert set(tensors) == set(optimizer_tensors(adam))
    assert {name.split(".", 2)[2] for name in tensors} == {"exp_avg", "exp_avg_sq", "step"}
    save_file(tensors, str(tmp_path / "optimizer.safetensors"))
    (tmp_path / "optimizer.json").write_text(json.dumps(meta), encoding="utf-8")

    again, fresh = _model_and_adam(1)  # other weights and no state: both come from the checkpoint
    again.load_state_dict(model.state_dict())
    load_state(fresh, load_file(str(tmp_path / "optimizer.safetensors")),
               json.loads((tmp_path / "optimizer.json").read_text(encoding="utf-8")))  # fmt: skip
    _step(model, adam, 3)
    _step(again, fresh, 3)
    for ours, theirs in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    assert tuple(fresh.param_groups[0]["betas"]) == (0.9, 0.98)  # (a list, through JSON)
    assert parameter_of(adam) is None  # whole parameters: nothing to slice
