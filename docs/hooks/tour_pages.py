"""MkDocs hook: each tour script (``docs/tour/*.py``, jupytext's "percent" format) becomes a page of the
site, its prose cells as text and its code cells as code, each followed by what it printed and the
figure it draws. The scripts stay the one source: nothing is copied by hand, and the tests run them.

What a cell printed comes from ``docs/tour/outputs/NAME.json``, recorded by running the page
(``python docs/record_tour.py``). A page whose script changed since it was recorded is reported (and
fails the strict build), so the site never shows outputs of code it no longer shows."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

import jupytext
from mkdocs.structure.files import File, Files

FIGURE = re.compile(r"""["']([\w.-]+\.png)["']""")  # a figure a cell writes (savefig, or attnkit's plots)
OUTPUTS = "outputs"  # docs/tour/outputs/NAME.json: what each code cell of NAME.py printed
RECORD = "python docs/record_tour.py"

log = logging.getLogger("mkdocs.plugins.tour_pages")


def script_digest(script: Path) -> str:
    """The SHA-256 of a script's text: a record of its outputs is current only while this is unchanged."""
    return hashlib.sha256(script.read_bytes()).hexdigest()


def read_cells(script: Path) -> list:
    """A percent script's cells (jupytext's notebook cells: ``cell_type`` and ``source``), in order."""
    return jupytext.reads(script.read_text(encoding="utf-8"), fmt="py:percent").cells


def record_path(script: Path) -> Path:
    return script.parent / OUTPUTS / f"{script.stem}.json"


def current_record(script: Path) -> dict | None:
    """The recorded outputs of a script, or None (with a warning, which fails a strict build) when there
    are none or the script has changed since they were recorded."""
    path = record_path(script)
    if not path.is_file():
        log.warning(f"{script.name} has no recorded outputs: run {RECORD} {script.stem}")
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    if record.get("script_sha256") != script_digest(script):
        log.warning(f"{script.name} changed since its outputs were recorded: run {RECORD} {script.stem}")
        return None
    return record


def _printed(text: str) -> str:
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return f'{fence}text title="printed"\n{text.rstrip()}\n{fence}'


def tour_page(script: Path) -> str:
    """The markdown of one tour script: prose, code, what the code printed and the figure it draws."""
    record = current_record(script)
    printed = iter(record["outputs"] if record else [])
    parts = []
    for cell in read_cells(script):
        if cell.cell_type == "markdown":
            parts.append(cell.source)
            continue
        parts.append(f"```python\n{cell.source}\n```")
        output = next(printed, "")
        if output.strip():
            parts.append(_printed(output))
        parts += [f"![{figure}]({figure})" for figure in FIGURE.findall(cell.source)]
    run = f"*This page is [`{script.name}`]({script.name}), run: `python {script.name}`."
    if record:
        run += (
            f" Its outputs were recorded on {record['recorded']} with torch {record['torch']} on"
            f" {record['threads']} CPU thread{'s' if record['threads'] != 1 else ''}; it took"
            f" {record['seconds']:.0f} s."
        )
    return "\n\n".join([*parts[:1], run + "*", *parts[1:]]) + "\n"


def on_files(files: Files, config) -> Files:
    """Add ``tour/NAME.md`` for each ``tour/NAME.py`` (MkDocs calls this once the docs are listed)."""
    for script in sorted((Path(config["docs_dir"]) / "tour").glob("*.py")):
        files.append(File.generated(config, f"tour/{script.stem}.md", content=tour_page(script)))
    return files
