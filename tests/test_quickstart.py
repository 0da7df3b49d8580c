"""README command #1: the quickstart reaches >= 99% exact match on held-out dates (about two minutes),
bound by its steps and seed rather than a clock: pinned to one core it trains as much, and as well."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from attnkit.cli import app
from tests.cli_checks import one_line_error


@pytest.mark.parametrize(
    "task", ["translation", "dates", None], ids=["another task", "same task", "unreadable"]
)
def test_quickstart_never_deletes_another_run(tmp_path, task):
    """A run a quickstart did not make (by the record in its checkpoints) is refused, whatever its task:
    even one on the quickstart's own task, dates, is someone's run."""
    checkpoint = tmp_path / "run" / "step-0000100"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    config = json.dumps({"data": {"task": task}}) if task else "{not json"
    (checkpoint / "config.json").write_text(config, encoding="utf-8")
    (tmp_path / "run" / "last").write_text("step-0000100", encoding="utf-8")
    result = CliRunner().invoke(app, ["quickstart", "--out", str(tmp_path / "run")])
    one_line_error(
        result,
        r"run holds a run \(last, step-0000100\) that is not an earlier quickstart's, which a quickstart",
    )
    assert (checkpoint / "model.safetensors").read_bytes() == b"weights"
    assert (tmp_path / "run" / "last").read_text(encoding="utf-8") == "step-0000100"


@pytest.mark.slow
def test_quickstart_pinned_to_one_core_trains_all_its_steps_reaches_99_percent_and_plots_attention(tmp_path):
    """``taskset -c 0 attnkit quickstart``: half the machine, the same 1,500 steps, >= 99% (a time budget
    used to stop it early there, at about 650 steps and 94%). Where there is no taskset, the whole
    machine: the command the README gives, which this test checks either way."""
    pinned = shutil.which("taskset") is not None and hasattr(os, "sched_getaffinity")
    pin = ["taskset", "-c", str(sorted(os.sched_getaffinity(0))[0])] if pinned else []
    command = [*pin, sys.executable, "-m", "attnkit", "quickstart"]
    result = subprocess.run([*command, "--out", str(tmp_path / "qs")], capture_output=True, encoding="utf-8",
                            timeout=900, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "for 1500 steps" in result.stdout
    found = re.search(r"held-out exact match .*: ([\d.]+)% of 500 dates", result.stdout)
    assert found and float(found.group(1)) >= 99.0, result.stdout
    last = (tmp_path / "qs" / "last").read_text(encoding="utf-8").strip()
    assert last == "step-0001500"
    png = tmp_path / "qs" / "attention.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert (tmp_path / "qs" / "averaged" / "model.safetensors").is_file()
