"""Every page of the tour (docs/tour/*.py) runs as a plain script from another folder, within its
budget, writes its figures there, and holds the numbers it states (each page ends with its checks)."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

TOUR = Path(__file__).resolve().parents[1] / "docs" / "tour"
PAGES = sorted(TOUR.glob("*.py"))
BUDGET_S = 120  # each page: two CPU minutes at most
# but the speech page, which synthesises 1,200 utterances with espeak-ng before its 420 steps: 91 to
# 161 s on the 2-core CI machine (its time varies with the machine's load more than the others')
BUDGETS_S = {"speech": 240}

pytestmark = pytest.mark.slow  # each page is a script of its own, up to two minutes


def test_the_tour_has_pages_and_the_index_names_each():
    index = (TOUR / "index.md").read_text(encoding="utf-8")
    assert len(PAGES) >= 10  # one idea a page
    for page in PAGES:
        assert f"({page.name})" in index and f"({page.stem}.png)" in index, page.name


@pytest.mark.parametrize("page", PAGES, ids=[page.stem for page in PAGES])
def test_a_page_runs_writes_its_figure_and_holds_its_numbers(page, tmp_path):
    began = time.monotonic()
    ran = subprocess.run([sys.executable, str(page)], cwd=tmp_path, capture_output=True, text=True,
                         encoding="utf-8", timeout=2 * BUDGETS_S.get(page.stem, BUDGET_S))  # fmt: skip
    took = time.monotonic() - began
    assert ran.returncode == 0, ran.stdout + ran.stderr  # a failed check is an AssertionError
    assert ran.stdout.splitlines()[-1].startswith("checked: "), ran.stdout
    figure = tmp_path / f"{page.stem}.png"
    assert figure.is_file() and figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", list(tmp_path.iterdir())
    assert took < BUDGETS_S.get(page.stem, BUDGET_S), f"{page.name} took {took:.0f} s"
