"""README command #1: the quickstart reaches >= 99% exact match on held-out dates (about two minutes)."""

from attnkit.quickstart import run_quickstart


def test_quickstart_learns_dates_to_iso_and_plots_attention(tmp_path):
    lines = []
    accuracy = run_quickstart(
        tmp_path / "qs", minutes=6.0, echo=lines.append
    )  # 1,500 steps; the cap is slack
    assert accuracy >= 0.99, "\n".join(lines)
    assert any("held-out exact match" in line for line in lines)
    png = tmp_path / "qs" / "attention.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert (tmp_path / "qs" / "averaged" / "model.safetensors").is_file()
