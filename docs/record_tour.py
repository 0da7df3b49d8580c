"""Runs pages of the tour and records what each code cell printed, for the site to show under the code
(``docs/tour/outputs/NAME.json``), and the figures each page draws (``docs/tour/NAME.png``):

    python docs/record_tour.py            # every page (a few minutes on a CPU)
    python docs/record_tour.py heads      # one page

Each page runs in a fresh process in an empty folder, its code cells one after another in one
namespace, as ``python PAGE.py`` runs them; the figures it writes there are then copied beside it. The
record keeps the script's SHA-256: the site's build refuses outputs of a script that has changed since.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "hooks"))
from tour_pages import OUTPUTS, read_cells, record_path, script_digest

TOUR = Path(__file__).resolve().parent / "tour"


def run_cells(script: Path) -> list[str]:
    """Run a script's code cells in order, in one namespace as ``python script`` would, and return what
    each printed (standard output; progress bars and warnings on standard error pass through)."""
    namespace = {"__name__": "__main__", "__file__": str(script)}
    sys.path.insert(0, str(script.parent))  # as python does for the script it runs
    printed = []
    for cell in read_cells(script):
        if cell.cell_type != "code":
            continue
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            exec(compile(cell.source, str(script), "exec"), namespace)  # the page's code, as python runs it
        printed.append(buffer.getvalue())
    return printed


def record(script: Path, into: Path) -> dict:
    """Run one page in a fresh process in an empty folder; write its record and figures under ``into``."""
    with tempfile.TemporaryDirectory(prefix=f"tour-{script.stem}-") as folder:
        began = time.monotonic()
        ran = subprocess.run(
            [sys.executable, __file__, "--cells-of", str(script)], cwd=folder, capture_output=True, text=True,
            encoding="utf-8",
        )  # fmt: skip
        if ran.returncode != 0:
            raise SystemExit(f"{script.name} failed:\n{ran.stdout}{ran.stderr}")
        child = json.loads(Path(folder, "cells.json").read_text(encoding="utf-8"))
        result = {
            "script_sha256": script_digest(script),
            "recorded": datetime.date.today().isoformat(),
            "seconds": round(time.monotonic() - began, 1),
            **child,
        }
        for figure in sorted(Path(folder).glob("*.png")):
            shutil.copyfile(figure, into / figure.name)
    path = record_path(into / script.name)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return result


def _child(script: Path) -> None:
    """In the page's own process: run its cells here and leave what they printed in ``cells.json``."""
    import torch

    outputs = run_cells(script)
    made_with = {"torch": torch.__version__.split("+")[0], "threads": torch.get_num_threads()}
    cells = json.dumps({**made_with, "outputs": outputs}, ensure_ascii=False)
    Path("cells.json").write_text(cells, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", help="page names (default: every page of docs/tour)")
    parser.add_argument("--into", type=Path, default=TOUR, help=f"where figures and {OUTPUTS}/ go")
    parser.add_argument("--cells-of", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cells_of:
        return _child(args.cells_of.resolve())
    names = args.pages or sorted(script.stem for script in TOUR.glob("*.py"))
    for name in names:
        script = TOUR / f"{Path(name).stem}.py"
        if not script.is_file():
            raise SystemExit(f"no tour page {script.name} in {TOUR}")
        result = record(script, args.into.resolve())
        print(f"{script.stem}: {len(result['outputs'])} cells, {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
