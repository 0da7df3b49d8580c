"""A run directory holds one run: the training process holds it while it runs (:func:`lock_run`), and
a new run finds what an earlier one left there (:func:`earlier_run`) to refuse or clear it
(:func:`prepare_run_dir`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: no flock; runs are not locked there
    fcntl = None

from attnkit.atomic import open_own
from attnkit.checkpoint.folder import CHECKPOINT_PREFIX
from attnkit.errors import AttnkitError

RUN_FILES = ("last", "best", "metrics.csv", "averaged")  # besides the step-* folders
LOCK_FILE = ".lock"  # held by the process training in the run directory (lock_run)


def lock_run(run_dir: Path) -> IO[str] | None:
    """Hold ``run_dir`` for this process until the returned file is closed or the process ends (even
    killed: the system lets go of the lock). A second ``attnkit train`` on the same directory then stops
    with one line instead of writing the same run twice (a second ``--resume``) or deleting the first
    one's checkpoints under it (``--overwrite``). None where the system has no ``flock`` (Windows)."""
    if fcntl is None:
        return None
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open_own(run_dir / LOCK_FILE, "r+", encoding="utf-8")  # held for the run
    except OSError as error:
        raise AttnkitError(f"{run_dir}: cannot write checkpoints there ({error.strerror or error})") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # held; any other error is a file system without locks (some NFS): go on
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise AttnkitError(
            f"{run_dir} is in use by {holder}: wait for it to end, or choose another run directory"
        ) from None
    except OSError:
        return handle
    handle.truncate(0)
    handle.write(f"attnkit train (process {os.getpid()})")
    handle.flush()
    return handle


def earlier_run(run_dir: Path) -> list[Path]:
    """What an earlier run left in ``run_dir``: checkpoint folders (half-written ones too), the pointers,
    the metrics log and the default average. Other files (a recipe kept there, say) do not count."""
    if not run_dir.is_dir():
        return []
    hidden = tuple(f".{name}" for name in (CHECKPOINT_PREFIX, *RUN_FILES))
    return sorted(
        p
        for p in run_dir.iterdir()
        if p.name in RUN_FILES or p.name.startswith((CHECKPOINT_PREFIX, *hidden, "metrics.csv"))
    )


def clear_run(run_dir: Path) -> None:
    """Delete what :func:`earlier_run` finds, pointers first (so none ever names a deleted folder)."""
    for path in sorted(earlier_run(run_dir), key=lambda p: p.name not in ("last", "best")):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def prepare_run_dir(
    run_dir: Path, replace: bool, overwrite: bool, main: bool, say: Callable[[str], None]
) -> None:
    """Make ``run_dir`` ready for a run: a new run (``replace``) needs one without an earlier run, or
    deletes it (``overwrite``, saying so); any run needs one it can write to, which is checked now
    rather than at the first checkpoint. Only the ``main`` process of a run writes there."""
    earlier = earlier_run(run_dir) if replace else []
    if earlier and not overwrite:
        names = ", ".join(p.name for p in earlier[:4]) + (", ..." if len(earlier) > 4 else "")
        raise AttnkitError(
            f"{run_dir} already holds a run ({names}): continue it with --resume, choose another "
            "run directory, or pass --overwrite to delete its checkpoints first"
        )
    if not main:
        return
    if earlier:
        clear_run(run_dir)
        say(f"overwrite: deleted the earlier run in {run_dir} ({len(earlier)} entries)")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as error:
        raise AttnkitError(f"{run_dir}: cannot write checkpoints there ({error.strerror or error})") from None
