"""Folders attnkit writes never replace what they were not made to replace (folders.py): a folder is
replaced only when empty, or made by the same command from the same source; a checkpoint, a run,
another command's output or the user's own files are refused in one line naming the folder and what it
holds, unless ``--overwrite``; and an output never replaces what it is made from, even then."""

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from attnkit import build_transformer
from attnkit.checkpoint.folder import CheckpointContents, save_checkpoint
from attnkit.cli import app
from attnkit.config import RunConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import AttnkitError
from attnkit.folders import MADE_BY, MadeBy, made_by, write_folder
from tests.cli.checks import one_line_error

runner = CliRunner()
AVERAGE_A = MadeBy("attnkit average", "/runs/a")


def _write_two_files(folder):
    (folder / "model.safetensors").write_text("new", encoding="utf-8")
    (folder / "config.json").write_text("{}", encoding="utf-8")


def _old(out, maker: MadeBy | None):
    """``out`` as an earlier write left it: two files and, with ``maker``, its record."""
    out.mkdir()
    (out / "model.safetensors").write_text("old", encoding="utf-8")
    (out / "config.json").write_text("{}", encoding="utf-8")
    if maker is not None:
        record = {"command": maker.command, "source": maker.source}  # an absolute source stays as it is
        (out / MADE_BY).write_text(json.dumps(record), encoding="utf-8")


def test_a_written_folder_records_what_made_it(tmp_path):
    write_folder(tmp_path / "out", _write_two_files, AVERAGE_A)
    assert made_by(tmp_path / "out") == AVERAGE_A
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary or aside copy left


@pytest.mark.parametrize("earlier", [None, AVERAGE_A], ids=["empty", "same command and source"])
def test_an_empty_folder_or_the_same_commands_earlier_output_is_replaced(tmp_path, earlier):
    out = tmp_path / "out"
    if earlier is None:
        out.mkdir()
    else:
        _old(out, earlier)
    write_folder(out, _write_two_files, AVERAGE_A)
    assert (out / "model.safetensors").read_text(encoding="utf-8") == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize(
    ("earlier", "message"),
    [
        (None, r"out holds a model \(config\.json, model\.safetensors\), not written by attnkit"),
        (MadeBy("attnkit average", "/runs/b"), r"out holds a model .*, made by attnkit average from /runs/b"),
        (MadeBy("attnkit export --to hf", "/runs/a"), r"made by attnkit export --to hf from /runs/a"),
    ],
    ids=["no record", "another source", "another command"],
)
def test_anything_else_is_refused_unless_overwrite(tmp_path, earlier, message):
    out = tmp_path / "out"
    _old(out, earlier)
    with pytest.raises(AttnkitError, match=message + r"; name a new or empty folder, or pass --overwrite"):
        write_folder(out, _write_two_files, AVERAGE_A)
    assert (out / "model.safetensors").read_text(encoding="utf-8") == "old"
    write_folder(out, _write_two_files, AVERAGE_A, overwrite=True)
    assert (out / "model.safetensors").read_text(encoding="utf-8") == "new" and made_by(out) == AVERAGE_A


@pytest.mark.parametrize("held", ["notes.txt", "step-0000100/model.safetensors"], ids=["file", "run"])
def test_the_same_commands_output_is_still_kept_if_it_holds_what_would_be_lost(tmp_path, held):
    out = tmp_path / "out"
    _old(out, AVERAGE_A)
    (out / held).parent.mkdir(parents=True, exist_ok=True)
    (out / held).write_text("the user's", encoding="utf-8")
    shown = held.split("/")[0] + ("/" if "/" in held else "")
    with pytest.raises(AttnkitError, match=rf"out holds {shown}, which writing there would delete"):
        write_folder(out, _write_two_files, AVERAGE_A)
    assert (out / held).read_text(encoding="utf-8") == "the user's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_file_is_never_replaced_by_a_folder(tmp_path):
    (tmp_path / "out").write_text("the user's", encoding="utf-8")
    for overwrite in (False, True):
        with pytest.raises(AttnkitError, match=r"out is a file; name a folder to write"):
            write_folder(tmp_path / "out", _write_two_files, AVERAGE_A, overwrite=overwrite)
    assert (tmp_path / "out").read_text(encoding="utf-8") == "the user's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# --- the commands -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Runs A and B of a tiny translator, two checkpoints each, as attnkit train writes them."""
    root = tmp_path_factory.mktemp("runs")
    tokenizer = Tokenizer.train("word", ["ein hund läuft", "a dog runs"] * 3, min_frequency=1)
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        model = build_transformer("tiny", tokenizer.vocab_size)
        config = RunConfig.for_model(model.config).to_dict()
        for step in (1, 2):
            with torch.no_grad():  # each checkpoint its own weights
                next(model.parameters()).add_(step)
            save_checkpoint(root / name, step, CheckpointContents(model, config, tokenizer.to_str()))
    return root


@pytest.fixture
def runs(two_runs, tmp_path):
    return shutil.copytree(two_runs, tmp_path / "runs")


def _weights(folder):
    return (folder / "model.safetensors").read_bytes()


def test_train_records_each_checkpoint(runs):
    assert made_by(runs / "a" / "step-0000002") == MadeBy.of("attnkit train", runs / "a")


def test_export_never_replaces_an_average_and_average_never_another_runs(runs):
    a, b = runs / "a", runs / "b"
    assert runner.invoke(app, ["average", "--run-dir", str(a), "--last", "2"]).exit_code == 0
    averaged = _weights(a / "averaged")
    exported = runner.invoke(app, ["export", "--ckpt", str(a), "--to", "hf", "--out", str(a / "averaged")])
    one_line_error(
        exported, r"a/averaged holds a model \(.*\), made by attnkit average from .*a; .*--overwrite"
    )
    other = runner.invoke(app, ["average", "--run-dir", str(b), "--out", str(a / "averaged")])
    one_line_error(other, r"a/averaged holds a model \(.*\), made by attnkit average from \S+/a; ")
    assert _weights(a / "averaged") == averaged
    again = runner.invoke(app, ["average", "--run-dir", str(a), "--last", "1"])  # the same run: replaced
    assert again.exit_code == 0, again.output
    assert _weights(a / "averaged") != averaged
    forced = runner.invoke(app, ["average", "--run-dir", str(b), "--out", str(a / "averaged"), "--overwrite"])
    assert forced.exit_code == 0, forced.output
    assert made_by(a / "averaged") == MadeBy.of("attnkit average", b)


def test_export_replaces_its_own_export_of_the_same_checkpoint_only(runs):
    a, b, out = runs / "a", runs / "b", runs / "hf"
    for _ in range(2):  # the same checkpoint exported again: replaced
        assert (
            runner.invoke(app, ["export", "--ckpt", str(a), "--to", "hf", "--out", str(out)]).exit_code == 0
        )
    other = runner.invoke(app, ["export", "--ckpt", str(b), "--to", "hf", "--out", str(out)])
    one_line_error(other, r"hf holds a model \(.*\), made by attnkit export --to hf from \S+a/step-0000002")
    (runs / "mine").mkdir()
    (runs / "mine" / "notes.txt").write_text("the user's", encoding="utf-8")
    mine = runner.invoke(app, ["export", "--ckpt", str(a), "--to", "hf", "--out", str(runs / "mine")])
    one_line_error(mine, r"mine holds files \(notes\.txt\), not written by attnkit; .*--overwrite")
    inside = ["export", "--ckpt", str(a / "step-0000002"), "--to", "hf", "--out", str(a), "--overwrite"]
    one_line_error(
        runner.invoke(app, inside), r"a holds step-0000002, which is a checkpoint it would be made"
    )
    assert (a / "step-0000002" / "model.safetensors").is_file()


def test_import_hf_replaces_its_own_import_and_nothing_else(runs):
    hf, a = runs / "hf", runs / "a"
    assert runner.invoke(app, ["export", "--ckpt", str(a), "--to", "hf", "--out", str(hf)]).exit_code == 0
    for _ in range(2):  # importing the same folder again replaces the earlier import
        imported = runner.invoke(app, ["import-hf", str(hf), "--out", str(runs / "imported")])
        assert imported.exit_code == 0, imported.output
    assert made_by(runs / "imported" / "step-0000000") == MadeBy.of("attnkit import-hf", hf)
    onto_a_run = runner.invoke(app, ["import-hf", str(hf), "--out", str(a)])
    one_line_error(onto_a_run, r"a already holds a run \(last, step-0000001, step-0000002\), not an import")
    assert sorted(p.name for p in a.iterdir()) == ["last", "step-0000001", "step-0000002"]
    forced = runner.invoke(app, ["import-hf", str(hf), "--out", str(a), "--overwrite"])
    assert forced.exit_code == 0, forced.output
    assert sorted(p.name for p in a.iterdir()) == ["best", "last", "step-0000000"]


@pytest.mark.slow
def test_quickstart_replaces_only_an_earlier_quickstart(tmp_path):
    out = tmp_path / "qs"
    for _ in range(2):  # an earlier quickstart is replaced
        result = runner.invoke(app, ["quickstart", "--out", str(out), "--steps", "2"])
        assert result.exit_code == 0, result.output
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    assert runner.invoke(app, ["quickstart", "--out", str(out), "--steps", "2"]).exit_code == 0
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine"  # never deleted


def test_quickstart_never_deletes_a_run_of_the_same_task(tmp_path):
    """A run that attnkit train made on the quickstart's own task (dates) is still another run."""
    run = tmp_path / "dates"
    trained = runner.invoke(app, ["train", "--run-dir", str(run), "data.task=dates", "data.tokenizer=char",
                                  "data.n_train=200", "data.n_valid=20", "model.preset=tiny",
                                  "train.max_steps=2", "train.max_tokens=500"])  # fmt: skip
    assert trained.exit_code == 0, trained.output
    before = sorted(p.name for p in run.iterdir())
    result = runner.invoke(app, ["quickstart", "--out", str(run), "--steps", "2"])
    one_line_error(result, r"dates holds a run \(.*\) that is not an earlier quickstart's, .*--overwrite")
    assert sorted(p.name for p in run.iterdir()) == before
