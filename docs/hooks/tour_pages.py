"""MkDocs hook: each tour script (``docs/tour/*.py``, jupytext's "percent" format) becomes a page of the
site, its prose cells as text and its code cells as code, with the figure it draws shown after the cell
that saves it. The scripts stay the one source: nothing is copied by hand, and the tests run them."""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
from mkdocs.structure.files import File, Files

FIGURE = re.compile(r"""["']([\w.-]+\.png)["']""")  # a figure a cell writes (savefig, or attnkit's plots)


def tour_page(script: Path) -> str:
    """The markdown of one tour script: prose, code, and the figure after the code that draws it."""
    notebook = jupytext.reads(script.read_text(encoding="utf-8"), fmt="py:percent")
    parts = []
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source)
            continue
        parts.append(f"```python\n{cell.source}\n```")
        parts += [f"![{figure}]({figure})" for figure in FIGURE.findall(cell.source)]
    run = f"*This page is [`{script.name}`]({script.name}), run: `python {script.name}`.*"
    return "\n\n".join([*parts[:1], run, *parts[1:]]) + "\n"


def on_files(files: Files, config) -> Files:
    """Add ``tour/NAME.md`` for each ``tour/NAME.py`` (MkDocs calls this once the docs are listed)."""
    for script in sorted((Path(config["docs_dir"]) / "tour").glob("*.py")):
        files.append(File.generated(config, f"tour/{script.stem}.md", content=tour_page(script)))
    return files
