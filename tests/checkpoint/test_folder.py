"""Checkpoints round-trip exactly (weights, optimizer, random states), name complete folders, prune,
survive a kill while saving or replacing, and get the user's usual permissions."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from attnkit import build_transformer
from attnkit.checkpoint import folder
from attnkit.checkpoint.average import average_checkpoints
from attnkit.checkpoint.folder import (
    CheckpointContents,
    list_checkpoints,
    load_model_weights,
    resolve_checkpoint,
    save_checkpoint,
)
from attnkit.checkpoint.trainer_state import TrainerState, load_trainer_state
from attnkit.errors import AttnkitError


def _save(run, step, model, optimizer=None, **kw):
    state = TrainerState(step=step) if optimizer is not None else None
    contents = CheckpointContents(model, {"note": "test"}, "{}", optimizer=optimizer, trainer_state=state)
    return save_checkpoint(run, step, contents, **kw)


def test_weights_optimizer_and_rng_round_trip_and_tied_weights_stay_tied(tmp_path):
    torch.manual_seed(0)
    model = build_transformer("tiny", 20)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randint(1, 20, (2, 5)), torch.randint(1, 20, (2, 4))).sum().backward()
    optimizer.step()
    path = _save(tmp_path, 7, model, optimizer)
    expected_random = torch.rand(3)  # drawn after the RNG state was saved

    loaded = build_transformer("tiny", 20)
    load_model_weights(loaded, path)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert loaded.generator.proj.weight is loaded.src_embed.lut.weight
    new_optimizer = torch.optim.Adam(loaded.parameters(), lr=1e-3)
    state, saved_by = load_trainer_state(path, new_optimizer)
    assert state.step == 7 and saved_by == 1
    assert torch.equal(torch.rand(3), expected_random)
    old_state, new_state = optimizer.state_dict()["state"], new_optimizer.state_dict()["state"]
    assert old_state.keys() == new_state.keys()
    for index, values in old_state.items():
        for key, value in values.items():
            assert torch.equal(value, new_state[index][key]), (index, key)


def test_pointers_name_complete_checkpoints_and_pruning_keeps_the_best(tmp_path):
    model = build_transformer("tiny", 20)
    _save(tmp_path, 1, model, is_best=True, keep_last=2)
    for step in (2, 3, 4):
        _save(tmp_path, step, model, keep_last=2)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["step-0000001", "step-0000003", "step-0000004"]
    assert resolve_checkpoint(tmp_path, "best").name == "step-0000001"
    assert resolve_checkpoint(tmp_path, "last").name == "step-0000004"
    with pytest.raises(AttnkitError, match="no checkpoint here"):
        resolve_checkpoint(tmp_path / "elsewhere")


def test_a_process_killed_while_saving_leaves_the_previous_checkpoint_intact(tmp_path):
    model = build_transformer("tiny", 20)
    _save(tmp_path, 1, model)
    before = load_file(str(tmp_path / "step-0000001" / "model.safetensors"))
    script = textwrap.dedent(f"""
        import os
        from attnkit import build_transformer
        import shutil
        from attnkit.checkpoint.average import average_checkpoints
        from attnkit.checkpoint.folder import CheckpointContents, save_checkpoint
        def die_mid_save(src, dst):  # the files are written; the process dies before the rename
            os._exit(9)
        os.replace = die_mid_save
        run = __import__("pathlib").Path({str(tmp_path)!r})
        save_checkpoint(run, 2, CheckpointContents(build_transformer("tiny", 20), {{}}, "{{}}"))
    """)
    result = subprocess.run([sys.executable, "-c", script], check=False)
    assert result.returncode == 9
    assert resolve_checkpoint(tmp_path, "last").name == "step-0000001"
    after = load_file(str(tmp_path / "step-0000001" / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not (tmp_path / "step-0000002").exists()
    assert any(p.name.startswith(".step-0000002") for p in tmp_path.iterdir())  # the torn attempt, hidden


def test_a_failed_save_cleans_up_and_raises(tmp_path, monkeypatch):
    model = build_transformer("tiny", 20)
    _save(tmp_path, 1, model)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(folder, "save_model", broken)
    with pytest.raises(AttnkitError, match=r"step-0000002: cannot write there \(disk full\)"):
        _save(tmp_path, 2, model)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".step")] == []
    assert (tmp_path / "last").read_text(encoding="utf-8") == "step-0000001"


def test_checkpoints_get_the_users_usual_permissions_not_tempfiles_private_ones(tmp_path):
    old_mask = os.umask(0o022)
    try:
        path = _save(tmp_path, 1, build_transformer("tiny", 20))
        averaged = average_checkpoints([path], tmp_path / "avg")
    finally:
        os.umask(old_mask)
    assert path.stat().st_mode & 0o777 == 0o755
    assert averaged.stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "last").stat().st_mode & 0o777 == 0o644


def _replace_in_a_process_that_dies(tmp_path, kill_at: str, average: bool = False) -> int:
    """Save step 1 (or the average) again with new weights in a subprocess killed ``kill_at``:
    "between renames" (after the old copy was renamed aside) or "before delete" (after both renames)."""
    script = textwrap.dedent(f"""
        import os, pathlib, torch
        from attnkit import build_transformer
        import shutil
        from attnkit.checkpoint.average import average_checkpoints
        from attnkit.checkpoint.folder import CheckpointContents, save_checkpoint
        run = pathlib.Path({str(tmp_path)!r})
        renames = []
        real_replace = os.replace
        def replace(src, dst):
            renames.append(dst)
            if {kill_at!r} == "between renames" and len(renames) == 2:
                os._exit(9)
            real_replace(src, dst)
        def rmtree(path, ignore_errors=False):
            os._exit(9)
        def die_in_the_replacement():
            os.replace = replace
            if {kill_at!r} == "before delete":
                shutil.rmtree = rmtree
        torch.manual_seed(1)
        model = build_transformer("tiny", 20)
        if {average!r}:
            path = save_checkpoint(run, 2, CheckpointContents(model, {{}}, "{{}}"), keep_last=9)
            die_in_the_replacement()
            average_checkpoints([path], run / "avg")
        else:
            die_in_the_replacement()
            save_checkpoint(run, 1, CheckpointContents(model, {{}}, "{{}}"))
    """)
    return subprocess.run([sys.executable, "-c", script], check=False).returncode


@pytest.mark.parametrize("average", [False, True], ids=["checkpoint", "average"])
def test_a_process_killed_between_the_renames_of_a_replacement_leaves_the_old_copy(tmp_path, average):
    torch.manual_seed(0)
    model = build_transformer("tiny", 20)
    first = _save(tmp_path, 1, model)
    target = average_checkpoints([first], tmp_path / "avg") if average else first
    before = load_file(str(target / "model.safetensors"))
    assert _replace_in_a_process_that_dies(tmp_path, "between renames", average) == 9
    assert not target.exists()  # the kill came after the old copy was renamed aside ...
    found = resolve_checkpoint(tmp_path / "avg") if average else resolve_checkpoint(tmp_path, "last")
    assert found == target  # ... and the next reader puts it back
    after = load_file(str(found / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(p.name.endswith(".replaced") for p in tmp_path.iterdir())


def test_a_process_killed_after_the_swap_leaves_the_new_copy_and_the_old_is_cleaned_up(tmp_path):
    torch.manual_seed(0)
    _save(tmp_path, 1, build_transformer("tiny", 20))
    assert _replace_in_a_process_that_dies(tmp_path, "before delete") == 9
    torch.manual_seed(1)
    expected = build_transformer("tiny", 20).state_dict()
    assert (tmp_path / ".step-0000001.replaced").is_dir()
    found = list_checkpoints(tmp_path)
    assert [p.name for p in found] == ["step-0000001"]
    weights = load_file(str(found[0] / "model.safetensors"))
    assert torch.equal(weights["encoder.layers.0.feed_forward.w_1.weight"],
                       expected["encoder.layers.0.feed_forward.w_1.weight"])  # fmt: skip
    assert not (tmp_path / ".step-0000001.replaced").exists()
