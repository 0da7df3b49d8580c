"""The command line prints a real model summary and turns user errors into one line."""

import re

from typer.testing import CliRunner

from attnkit import build_transformer
from attnkit.cli import app

runner = CliRunner()


def test_summary_prints_the_models_true_parameter_count_and_runs_a_forward_pass():
    result = runner.invoke(app, ["summary", "--preset", "tiny", "--vocab", "100", "--length", "5"])
    assert result.exit_code == 0, result.output
    total = sum(p.numel() for p in build_transformer("tiny", 100).parameters())
    assert re.search(rf"total\s+{total:,} parameters", result.output)
    assert "tgt_embed" in result.output and "(shared)" in result.output
    assert "-> logits (2, 5, 100)" in result.output


def test_unknown_preset_is_one_line_on_stderr_with_exit_code_2():
    result = runner.invoke(app, ["summary", "--preset", "paper-huge"])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0
    assert "unknown preset 'paper-huge'" in result.stderr
