"""The documentation site builds strictly (``mkdocs build --strict``): every page in the menu exists,
every link between pages resolves, every module of the API reference renders from its docstrings, and
every tour page shows its code with what it printed, recorded from the script as it is now."""

import importlib.util
import json
import logging
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
TOUR = ROOT / "docs" / "tour"


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_each_tour_script_is_a_page_of_the_site_with_its_code_outputs_and_figure(tmp_path):
    built = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    for script in sorted(TOUR.glob("*.py")):
        page = (tmp_path / "site" / "tour" / script.stem / "index.html").read_text(encoding="utf-8")
        assert f'src="../{script.stem}.png"' in page, script.name  # the figure, after the code drawing it
        assert 'class="highlight"' in page and f'href="../{script.name}"' in page, script.name  # code, source
        assert '<span class="filename">printed</span>' in page and "checked: " in page, script.name  # outputs


def test_the_recorded_outputs_are_what_the_script_prints_when_run(tmp_path):
    """The recorder runs a page cell by cell; what the cells printed, together, is what ``python PAGE.py``
    prints, and the figure it writes is the one the plain run writes."""
    recorder = _load(ROOT / "docs" / "record_tour.py")
    into = tmp_path / "recorded"
    into.mkdir()
    recorded = recorder.record(TOUR / "scaling.py", into)
    plain = tmp_path / "plain"
    plain.mkdir()
    ran = subprocess.run([sys.executable, str(TOUR / "scaling.py")], cwd=plain, capture_output=True,
                         text=True, encoding="utf-8", check=True)  # fmt: skip
    assert len(recorded["outputs"]) == 3 and "".join(recorded["outputs"]) == ran.stdout
    assert recorded["outputs"][-1].startswith("checked: ")
    assert (into / "scaling.png").read_bytes() == (plain / "scaling.png").read_bytes()
    saved = json.loads((into / "outputs" / "scaling.json").read_text(encoding="utf-8"))
    assert saved["outputs"] == recorded["outputs"] and saved["script_sha256"] == recorded["script_sha256"]


def test_a_page_changed_since_its_outputs_were_recorded_is_reported(tmp_path, caplog):
    """A stale record is not shown, and the warning fails a strict build, naming the command to run."""
    hook = _load(ROOT / "docs" / "hooks" / "tour_pages.py")
    script = tmp_path / "page.py"
    script.write_text('# %% [markdown]\n# # A page\n\n# %%\nprint("old")\n', encoding="utf-8")
    (tmp_path / "outputs").mkdir()
    record = {"script_sha256": hook.script_digest(script), "recorded": "2026-11-26", "torch": "2.13.0",
              "threads": 2, "seconds": 1.0, "outputs": ["old\n"]}  # fmt: skip
    (tmp_path / "outputs" / "page.json").write_text(json.dumps(record), encoding="utf-8")
    assert "old" in hook.tour_page(script).split("```text", 1)[1]  # current: shown
    script.write_text(script.read_text(encoding="utf-8").replace("old", "new"), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        page = hook.tour_page(script)
    assert "```text" not in page and "python docs/record_tour.py page" in caplog.text


def test_a_broken_link_fails_the_build(tmp_path):
    """The check above can fail: the same site with one page linking to a page that does not exist."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\nSee [the missing page](missing.md).\n", encoding="utf-8")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"site_name: x\ndocs_dir: {docs}\nstrict: true\n", encoding="utf-8")
    built = _build(config, tmp_path / "site")
    assert built.returncode != 0 and "missing.md" in built.stderr
