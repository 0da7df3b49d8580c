"""A run directory holds one run: a new run refuses an earlier one (or deletes it with --overwrite), a
resumed run finds its data from any working directory, and the quickstart never averages leftovers."""

import errno
import gzip
import re
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from attnkit import quickstart
from attnkit.checkpoint.folder import list_checkpoints, read_run_config
from attnkit.checkpoint.run_dir import lock_run
from attnkit.cli import app
from attnkit.config import load_run_config
from attnkit.data.synthetic import copy
from attnkit.errors import AttnkitError
from attnkit.train.loop import Trainer
from tests.cli.checks import one_line_error

runner = CliRunner()
TINY = ["model.preset=tiny", "data.tokenizer=word", "train.max_tokens=300", "train.schedule=constant",
        "train.lr=0.003", "train.warmup=5", "data.train=[train.src.gz, train.tgt.gz]",
        "data.valid=[valid.src, valid.tgt]"]  # fmt: skip


@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    pairs = copy(200, 0, max_length=5)
    (folder / "train.src.gz").write_bytes(gzip.compress(("\n".join(pairs.src) + "\n").encode()))
    (folder / "train.tgt.gz").write_bytes(gzip.compress(("\n".join(pairs.tgt) + "\n").encode()))
    valid = copy(10, 1, max_length=5)
    (folder / "valid.src").write_text("\n".join(valid.src) + "\n", encoding="utf-8")
    (folder / "valid.tgt").write_text("\n".join(valid.tgt) + "\n", encoding="utf-8")
    return folder


def _train(run, data, *extra):
    return runner.invoke(app, ["train", "--run-dir", str(run), "--data", str(data), *TINY, *extra])


def test_a_new_run_refuses_a_directory_holding_an_earlier_run(tmp_path, data_dir):
    run = tmp_path / "run"
    assert _train(run, data_dir, "train.max_steps=6", "train.eval_every=3").exit_code == 0
    result = _train(run, data_dir, "train.max_steps=2", "train.eval_every=1")
    one_line_error(
        result,
        r"already holds a run \(best, last, metrics\.csv, step-0000003, \.\.\.\): "
        r"continue it with --resume, .*--overwrite",
    )
    assert [p.name for p in list_checkpoints(run)] == ["step-0000003", "step-0000006"]  # untouched


def test_overwrite_deletes_the_earlier_runs_checkpoints_before_training(tmp_path, data_dir):
    run = tmp_path / "run"
    assert _train(run, data_dir, "train.max_steps=6", "train.eval_every=2").exit_code == 0
    (run / "recipe_notes.txt").write_text("kept: not a run file", encoding="utf-8")
    assert runner.invoke(app, ["average", "--run-dir", str(run), "--last", "2"]).exit_code == 0
    result = _train(run, data_dir, "--overwrite", "train.max_steps=3", "train.eval_every=3")
    assert result.exit_code == 0, result.output
    assert "deleted the earlier run" in result.output
    assert [p.name for p in list_checkpoints(run)] == ["step-0000003"]
    assert not (run / "averaged").exists()  # an average of the old run would mislead
    assert (run / "recipe_notes.txt").is_file()
    result = runner.invoke(app, ["average", "--run-dir", str(run), "--last", "3"])
    assert "averaged 1 checkpoints (only 1 exist) (step-0000003)" in result.output


def test_other_files_in_the_directory_are_not_an_earlier_run(tmp_path, data_dir):
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.yaml").write_text("train:\n  max_steps: 2\n", encoding="utf-8")
    assert _train(run, data_dir, "train.max_steps=2", "train.eval_every=2").exit_code == 0


def test_an_unwritable_run_directory_fails_before_reading_data(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("", encoding="utf-8")
    result = _train(blocker / "run", tmp_path / "no_data", "train.max_steps=2")
    assert result.exit_code == 2
    assert re.search(r"a_file/run: cannot write checkpoints there", result.stderr), result.stderr


def test_a_run_directory_in_use_by_another_training_is_refused_and_left_as_it_is(tmp_path, data_dir):
    run = tmp_path / "run"
    assert _train(run, data_dir, "train.max_steps=4", "train.eval_every=2").exit_code == 0
    held = lock_run(run)  # another `attnkit train` training in it, as far as this one can tell
    pattern = r"run is in use by attnkit train \(process \d+\): wait for it to end, or choose another run"
    one_line_error(_train(run, data_dir, "--overwrite", "train.max_steps=2"), pattern)
    one_line_error(runner.invoke(app, ["train", "--resume", str(run), "train.max_steps=6"]), pattern)
    assert [p.name for p in list_checkpoints(run)] == ["step-0000002", "step-0000004"]  # nothing deleted
    held.close()  # the other run ended
    result = runner.invoke(app, ["train", "--resume", str(run), "train.max_steps=6"])
    assert result.exit_code == 0, result.output
    assert (run / "last").read_text(encoding="utf-8") == "step-0000006"


def test_a_killed_training_leaves_its_run_directory_free(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import pathlib, sys, time
        from attnkit.checkpoint.run_dir import lock_run
        held = lock_run(pathlib.Path({str(tmp_path / "run")!r}))  # kept open: the lock lives with it
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True, encoding="utf-8")  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(AttnkitError, match=rf"in use by attnkit train \(process {holder.pid}\)"):
        lock_run(tmp_path / "run")
    holder.kill()  # SIGKILL: no clean-up runs
    holder.wait()
    lock_run(tmp_path / "run").close()  # free again


def test_resume_from_another_working_directory_finds_relative_data(tmp_path, data_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["train", "--run-dir", "run", "--data", "data", *TINY, "train.max_steps=2",
                                 "train.eval_every=2"])  # fmt: skip
    assert result.exit_code == 0, result.output
    config = read_run_config(list_checkpoints(tmp_path / "run")[-1])
    assert config.data.dir == str(data_dir.resolve())  # stored resolved
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = runner.invoke(app, ["train", "--resume", str(tmp_path / "run"), "train.max_steps=4"])
    assert result.exit_code == 0, result.output
    assert (
        "resumed from" in result.output
        and (tmp_path / "run" / "last").read_text(encoding="utf-8") == "step-0000004"
    )


def test_resume_and_overwrite_together_are_refused(tmp_path, data_dir):
    run = tmp_path / "run"
    assert _train(run, data_dir, "train.max_steps=2", "train.eval_every=2").exit_code == 0
    result = runner.invoke(app, ["train", "--resume", str(run), "--overwrite"])
    assert result.exit_code == 2 and "give one of them" in result.stderr
    result = runner.invoke(app, ["train", "--resume", str(run), "--run-dir", str(tmp_path / "other")])
    assert result.exit_code == 2 and "differ" in result.stderr
    with pytest.raises(AttnkitError, match="exclude each other"):
        Trainer(load_run_config(None, ["train.max_steps=1"]), run, resume=True, overwrite=True)


def test_quickstart_twice_in_one_folder_averages_only_its_own_checkpoints(tmp_path, monkeypatch):
    small = {**quickstart.RECIPE, "data": {**quickstart.RECIPE["data"], "n_train": 300, "n_valid": 20}}
    monkeypatch.setattr(quickstart, "RECIPE", small)
    out = tmp_path / "qs"
    quickstart.run_quickstart(out, max_steps=6, echo=lambda m: None)
    assert [p.name for p in list_checkpoints(out)] == ["step-0000006"]
    quickstart.run_quickstart(out, max_steps=4, echo=lambda m: None)
    assert [p.name for p in list_checkpoints(out)] == ["step-0000004"]


def test_a_resumed_run_refuses_model_or_vocabulary_changes_but_allows_new_dropout(tmp_path, data_dir):
    run = tmp_path / "run"
    assert _train(run, data_dir, "train.max_steps=2", "train.eval_every=2").exit_code == 0
    for change, message in (
        ("model.activation=gelu", r"model\.activation='gelu' \(the run has 'relu'\)"),
        ("model.sinusoid_layout=concatenated", r"model\.sinusoid_layout='concatenated'"),
        ("data.vocab_size=500", r"data\.vocab_size=500 \(the run has 8000\)"),
    ):
        result = runner.invoke(app, ["train", "--resume", str(run), "train.max_steps=4", change])
        assert result.exit_code == 2, result.output
        assert re.search(rf"a resumed run keeps its model and vocabulary, but {message}", result.stderr)
    result = runner.invoke(app, ["train", "--resume", str(run), "train.max_steps=4", "model.dropout=0.2"])
    assert result.exit_code == 0, result.output


def test_a_file_system_without_locks_trains_unlocked_rather_than_refusing(tmp_path, monkeypatch):
    from attnkit.checkpoint import run_dir

    def no_locks_here(*args):
        raise OSError(errno.ENOLCK, "No locks available")  # what some NFS mounts answer

    monkeypatch.setattr(run_dir.fcntl, "flock", no_locks_here)
    lock_run(tmp_path / "run").close()


def test_a_lock_file_planted_as_a_symbolic_link_is_refused_and_its_target_left_as_it_is(tmp_path):
    """A shared run folder: someone links RUN/.lock to a file of yours; training used to overwrite it."""
    run, target = tmp_path / "run", tmp_path / "precious.txt"
    run.mkdir()
    target.write_text("mine\n", encoding="utf-8")
    (run / ".lock").symlink_to(target)
    with pytest.raises(AttnkitError, match=r"run/\.lock: a symbolic link; attnkit never writes through one"):
        lock_run(run)
    assert target.read_text(encoding="utf-8") == "mine\n"
