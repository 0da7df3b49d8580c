"""What ``attnkit distill-draft`` learns from: the lines of ``--src``, or the run's own training sources
(a translation's source file, a summariser's JSON Lines field); a run whose data is generated needs
``--src``, said in one line."""

from __future__ import annotations

import gzip
import json

import pytest

from attnkit.cli.training import _draft_sources
from attnkit.config import load_run_config
from attnkit.errors import AttnkitError


def test_a_draft_learns_from_the_runs_training_sources_or_the_given_file(tmp_path):
    (tmp_path / "train.de").write_text("ein Hund\nzwei Katzen\n", encoding="utf-8")
    parallel = load_run_config(None, [f"data.dir={tmp_path}", "data.train=[train.de, train.en]"])
    assert _draft_sources(parallel, None) == ["ein Hund", "zwei Katzen"]
    with gzip.open(tmp_path / "train.jsonl.gz", "wt", encoding="utf-8") as f:
        for email, subject in [("the meeting moved to noon", "meeting"), ("lunch is on me", "lunch")]:
            f.write(json.dumps({"email": email, "subject": subject}) + "\n")
    summarise = load_run_config(None, [
        "data.task=summarise", f"data.dir={tmp_path}", "data.train=[train.jsonl.gz]",
        "data.fields=[email, subject]", "model.copy=true",
    ])  # fmt: skip
    assert _draft_sources(summarise, None) == ["the meeting moved to noon", "lunch is on me"]
    assert _draft_sources(summarise, tmp_path / "train.de") == ["ein Hund", "zwei Katzen"]
    generated = load_run_config(None, ["data.task=dates"])
    with pytest.raises(AttnkitError, match=r"data\.task=dates\) is not read from files: give --src FILE"):
        _draft_sources(generated, None)
