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


def _help(*command: str) -> str:
    result = runner.invoke(app, [*command, "--help"], terminal_width=200, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split("│"))  # without the option table's borders


def test_help_paragraphs_wrap_at_the_terminal_not_where_the_docstring_lines_end():
    """typer shows the lines of a command's later paragraphs as written: its help read "an empty line,
    and the" / "counts of empty sources" on two lines of an 80-column terminal, and the main help
    showed the module docstring for developers (class names such as AttnkitError)."""
    assert "an empty line, and the counts of empty sources and references are printed" in _help("evaluate")
    main_help = _help()
    assert "reported in one line that names it, with exit status 2; options and output paths" in main_help
    assert "AttnkitError" not in main_help and "``" not in main_help
    commands = [c.name or c.callback.__name__ for c in app.registered_commands]
    for command in [*commands, "data get"]:
        text = _help(*command.split())
        assert "``" not in text and "PART_LINES" not in text, command


def test_the_progress_bar_shows_on_a_terminal_only_where_asked(monkeypatch):
    """Under torchrun every process would draw its own bar on the same terminal: only the first shows."""
    import sys

    from attnkit.cli.shared import progress_bar

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with progress_bar() as shown, progress_bar(show=False) as hidden:
        assert not shown.disable and hidden.disable
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    with progress_bar() as in_a_log:
        assert in_a_log.disable
