"""The benchmark scripts run end to end (at toy sizes: this checks them, it measures nothing)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize(
    ("script", "arguments", "summary"),
    [
        ("attention.py", ["--quick"], r"median MultiHeadAttention/torch_mha time = \d+\.\d+"),
        (
            "forward.py",
            ["--preset", "tiny", "--shapes", "2x4"],
            r"median EncoderDecoder/torch_transformer time = \d",
        ),
    ],
)
def test_benchmark_prints_ours_over_peer_ratios(script, arguments, summary):
    result = subprocess.run(
        [sys.executable, str(BENCH / script), "--rounds", "1", *arguments],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.search(summary, result.stdout), result.stdout
    cases = [line for line in result.stdout.splitlines() if re.search(r"ours/\w+ time = \d", line)]
    assert len(cases) >= 1, result.stdout
