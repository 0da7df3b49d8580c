"""The task records are what each task does: a run of every ``data.task`` (one step) validates with the
scores its record names, the default model of each architecture trains the tasks its records give it,
and ``attnkit prepare`` encodes the data of exactly the tasks whose records say it does."""

import gzip
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnkit.cli import app
from attnkit.config import RunConfig, load_run_config
from attnkit.errors import ConfigError
from attnkit.models import ARCHITECTURES
from attnkit.task_records import TASK_RECORDS, task_record, tasks_training
from attnkit.train.loop import Trainer

LINES = [
    "the cat sat on a mat",
    "two dogs ran past the old red barn",
    "a mat on the barn",
    "the old cat ran",
    "red dogs sat",
    "past the mat two cats",
]


def _files(folder):
    """Tiny data files for every task that reads files: parallel text, summaries, text, sentences."""
    lines = LINES
    for split in ("train", "valid"):
        (folder / f"{split}.src").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (folder / f"{split}.tgt").write_text("\n".join(reversed(lines)) + "\n", encoding="utf-8")
        records = [{"source": line, "target": line[:9]} for line in lines]
        with gzip.open(folder / f"{split}.jsonl.gz", "wt", encoding="utf-8") as out:
            out.writelines(json.dumps(record) + "\n" for record in records)
        labelled = [f"{line}\t{'yes' if i % 2 else 'no'}" for i, line in enumerate(lines)]
        (folder / f"{split}.tsv").write_text("\n".join(labelled) + "\n", encoding="utf-8")
    return folder


SMALL = ["data.n_train=40", "data.n_valid=8", "train.max_steps=1", "train.eval_every=1", "train.log_every=0"]
ENCODER = ["model.arch=encoder", "model.preset=tiny-encoder"]
SETTINGS = {  # each task with a small model of an architecture it trains
    "parallel": ["model.preset=tiny", "data.tokenizer=char", "data.train=[train.src, train.tgt]",
                 "data.valid=[valid.src, valid.tgt]"],
    "dates": ["model.preset=tiny", "data.tokenizer=char"],
    "copy": ["model.arch=rnn", "data.tokenizer=char"],
    "summarise": ["model.preset=tiny", "data.tokenizer=char", "data.train=[train.jsonl.gz]",
                  "data.valid=[valid.jsonl.gz]"],
    "text": ["model.arch=decoder", "model.preset=tiny-decoder", "data.tokenizer=char",
             "data.train=[train.src]"],
    "classify": [*ENCODER, "data.tokenizer=char",
                 "data.train=[train.tsv]", "data.valid=[valid.tsv]"],
    "mlm": [*ENCODER, "data.tokenizer=char", "data.train=[train.src]"],
    "qa": [*ENCODER, "model.max_len=128"],
    "cluttered-digits": ["model.arch=whole-image", "model.d_hidden=64"],
    "captions": ["model.arch=show-attend-tell"],
    "speech": ["model.arch=listen-attend-spell", "model.preset=las-tiny", "data.n_train=8"],
}  # fmt: skip


def test_every_task_has_a_small_run_here_and_the_conventions_page_names_each():
    assert sorted(SETTINGS) == sorted(TASK_RECORDS)
    page = (Path(__file__).resolve().parents[1] / "docs" / "conventions.md").read_text(encoding="utf-8")
    assert [name for name in TASK_RECORDS if f"`{name}`" not in page] == []


@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_run_of_each_task_validates_with_the_scores_its_record_names(name, tmp_path):
    if name == "speech" and shutil.which("espeak-ng") is None:
        pytest.skip("the speech task synthesises its utterances with espeak-ng")
    if name == "captions":
        pytest.importorskip("sklearn", reason="the digit scenes are drawn from scikit-learn's digits")
    record = task_record(name)
    config = load_run_config(
        None, [f"data.task={name}", f"data.dir={_files(tmp_path)}", *SMALL, *SETTINGS[name]]
    )
    assert config.model.arch in record.trains and config.train.eval_metric == next(iter(record.metrics))
    scores = Trainer(config, tmp_path / "run", echo=lambda message: None).fit()
    assert set(record.metrics.values()) <= set(scores), (record.metrics, scores)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_each_architecture_trains_the_tasks_its_records_give_it(arch):
    """Its default run config is of a task that trains it; a task that does not is a one-line error
    naming the tasks that do."""
    trained = tasks_training(arch)
    assert trained, arch
    config = load_run_config(None, [f"model.arch={arch}", f"data.task={trained[0]}"])
    assert config.model.arch == arch
    other = next(name for name, record in TASK_RECORDS.items() if arch not in record.trains)
    with pytest.raises(
        ConfigError, match=rf"model\.arch='{arch}' does data\.task {', '.join(sorted(trained))}"
    ):
        load_run_config(None, [f"model.arch={arch}", f"data.task={other}"])


@pytest.mark.parametrize(("head", "task"), [("classify", "classify"), ("mlm", "mlm"), ("span", "qa")])
def test_an_imported_encoder_does_the_task_of_its_head(head, task):
    model = load_run_config(None, ["model.arch=encoder", f"data.task={task}"]).model
    assert model.head == head and RunConfig.for_model(model).data.task == task


@pytest.mark.parametrize("name", list(TASK_RECORDS))
def test_attnkit_prepare_encodes_the_tasks_whose_records_say_so(name, tmp_path):
    """A task with a store: ``attnkit prepare`` builds it, and finds it built the second time; any other
    is a one-line error naming what prepare encodes."""
    settings = ["prepare", f"data.task={name}", f"data.dir={_files(tmp_path)}", *SETTINGS[name]]
    first = CliRunner().invoke(app, settings)
    if task_record(name).store:
        assert first.exit_code == 0 and "rows, built now)" in first.output, first.output
        again = CliRunner().invoke(app, settings)
        assert again.exit_code == 0 and "rows, built before)" in again.output, again.output
    else:
        assert first.exit_code != 0
        assert (
            f"data.task={name}: attnkit prepare encodes parallel files (parallel), summaries (summarise)"
            in (first.output)
        ), first.output
