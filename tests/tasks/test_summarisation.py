"""Summarisation (``data.task: summarise``): JSON Lines in, long sources cut (and counted) rather than
dropped, validation by ROUGE against every reference; trained end to end on a tiny generated set where
the summary is the email's first word twice ("budget budget" for "budget meeting moved ...")."""

import csv
import gzip
import json
import random

import pytest

pytest.importorskip("rouge_score", reason="summarisation is scored with rouge-score")

from typer.testing import CliRunner

from attnkit.cli import app
from attnkit.config import load_run_config
from attnkit.errors import ConfigError
from attnkit.train.loop import Trainer

WORDS = ["budget", "meeting", "contract", "invoice", "schedule", "report", "gas", "power"]


def _emails(n: int, seed: int, long_every: int = 5) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for i in range(n):
        body = [rng.choice(WORDS) for _ in range(rng.randint(4, 8))]
        if i % long_every == 0:
            body += ["filler"] * 40  # longer than data.max_source_len: cut, not dropped
        summary = f"{body[0]} {body[0]}"
        records.append({"email": " ".join(body), "subject": summary, "annotations": [summary, body[0]]})
    return records


@pytest.fixture(scope="module")
def aeslc_like(tmp_path_factory):
    folder = tmp_path_factory.mktemp("aeslc")
    for name, n, seed in (("train.jsonl.gz", 400, 0), ("dev.jsonl.gz", 30, 1)):
        with gzip.open(folder / name, "wt", encoding="utf-8") as f:
            f.write("\n".join(json.dumps(r) for r in _emails(n, seed)) + "\n")
    return folder


@pytest.fixture(scope="module")
def summariser(aeslc_like, tmp_path_factory):
    """A trained run directory, and what training said."""
    run = tmp_path_factory.mktemp("summariser") / "run"
    settings = [f"data.dir={aeslc_like}", "data.task=summarise", "data.train=[train.jsonl.gz]",
                "data.valid=[dev.jsonl.gz]", "data.fields=[email, subject]", "data.references=annotations",
                "data.max_source_len=16", "data.tokenizer=word", "model.preset=tiny", "train.lr=3e-3",
                "train.schedule=constant", "train.warmup=0", "train.max_tokens=1024", "train.max_steps=150",
                "train.eval_every=150", "train.eval_metric=rouge1", "train.label_smoothing=0"]  # fmt: skip
    said = []
    Trainer(load_run_config(None, settings), run, echo=said.append).fit()
    return run, said


def test_a_summariser_trains_on_json_lines_and_is_validated_by_rouge(summariser):
    run, said = summariser
    assert any("cut 80 of 400 training sources to data.max_source_len=16 tokens" in m for m in said), said
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    last = rows[-1]
    assert {"valid_rouge1", "valid_rouge2", "valid_rougeL"} <= set(last)
    # "w w" against the references "w w" and "w": learned, every summary is right
    assert float(last["valid_rouge1"]) > 90 and float(last["valid_rouge2"]) > 80


def test_summarisation_settings_are_checked():
    with pytest.raises(ConfigError, match=r"data.fields must be \[source field, target field\]"):
        load_run_config(None, ["data.task=summarise", "data.fields=[email]"])
    with pytest.raises(ConfigError, match=r"train\.eval_metric='bleu'"):
        load_run_config(None, ["data.task=summarise", "train.eval_metric=bleu"])


def test_evaluate_scores_summaries_against_the_subject_and_the_annotations(summariser, aeslc_like):
    run, _ = summariser
    result = CliRunner().invoke(
        app, ["evaluate", "--ckpt", str(run), "--data", str(aeslc_like / "dev.jsonl.gz")]
    )
    assert result.exit_code == 0, result.output
    subject, annotations, summary = result.stdout.splitlines()
    assert subject.startswith("against 'subject': ROUGE-1 ") and annotations.startswith(
        "against 'annotations'"
    )
    assert "30 records" in summary and "6 sources cut to 16 tokens" in summary and "stemmer" in summary
    wrong = CliRunner().invoke(app, ["evaluate", "--ckpt", str(run), "--src", "x", "--ref", "y"])
    assert wrong.exit_code == 2 and "evaluate it with --data FILE.jsonl" in wrong.output
