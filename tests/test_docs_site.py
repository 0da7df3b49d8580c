"""The documentation site builds strictly (``mkdocs build --strict``): every page in the menu exists,
every link between pages resolves, and every module of the API reference renders from its docstrings."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the site needs MkDocs: pip install 'attnkit[docs]'")
pytest.importorskip(
    "mkdocstrings", reason="the API reference needs mkdocstrings: pip install 'attnkit[docs]'"
)

ROOT = Path(__file__).resolve().parents[1]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True, text=True, encoding="utf-8", cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


def test_the_site_builds_strictly_with_every_reference_page_rendered(tmp_path):
    built = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    attention = (tmp_path / "site" / "reference" / "attention" / "index.html").read_text(encoding="utf-8")
    for rendered in ("functional.attend_reference", "masks.causal_mask", "multihead.MultiHeadAttention"):
        assert f'id="attnkit.attention.{rendered}"' in attention, rendered  # rendered from its docstring
    serving = (tmp_path / "site" / "serving" / "index.html").read_text(encoding="utf-8")
    assert "CTranslate2 as the engine" in serving


def test_each_tour_script_is_a_page_of_the_site_with_its_code_and_figure(tmp_path):
    built = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    for script in sorted((ROOT / "docs" / "tour").glob("*.py")):
        page = (tmp_path / "site" / "tour" / script.stem / "index.html").read_text(encoding="utf-8")
        assert f'src="../{script.stem}.png"' in page, script.name  # the figure, after the code drawing it
        assert 'class="highlight"' in page and f'href="../{script.name}"' in page, script.name  # code, source


def test_a_broken_link_fails_the_build(tmp_path):
    """The check above can fail: the same site with one page linking to a page that does not exist."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\nSee [the missing page](missing.md).\n", encoding="utf-8")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"site_name: x\ndocs_dir: {docs}\nstrict: true\n", encoding="utf-8")
    built = _build(config, tmp_path / "site")
    assert built.returncode != 0 and "missing.md" in built.stderr
