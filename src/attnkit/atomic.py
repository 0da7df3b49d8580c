"""Writing files so that a reader (or a process killed halfway) never sees half of one.

A file is written under a hidden temporary name in the same folder, fsync'ed, given the permissions the
user's umask gives any new file, and renamed over the old one in one step; the folder is fsync'ed too,
so that the rename survives a crash. Checkpoints (checkpoint.py), CLI outputs and prepared data
sets (data/download.py) are written this way.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TextIO

from attnkit.errors import AttnkitError

LINK_REFUSED = "a symbolic link; attnkit never writes through one (remove it)"
# how open()'s modes map onto os.open's flags, for the modes attnkit opens its own files with
_FLAGS = {
    "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "r+": os.O_RDWR | os.O_CREAT,
}


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask_by_setting_it() -> int:
    """The umask, read the only portable way: by setting it and back. Between the two calls a file made
    by another thread would get no umask at all, so this is done once, at import (see :func:`_umask`)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK_AT_IMPORT = _umask_by_setting_it()


def _umask() -> int:
    """The process's umask, read without changing it: from ``/proc/self/status`` (Linux), else as it was
    when attnkit was imported."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _UMASK_AT_IMPORT


def make_shareable(path: Path) -> None:
    """Give a file or folder made by ``tempfile`` (private, 0600/0700) the usual permissions for the
    user's umask, so that a checkpoint can be shared like any other file."""
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_umask())


@contextmanager
def atomic_writer(path: Path) -> Iterator[TextIO]:
    """A text file (UTF-8, as attnkit reads text) that becomes ``path`` when the block ends, written piece
    by piece: a reader sees the old content or all of the new, never a part, and an error (or Ctrl-C)
    inside the block leaves ``path`` as it was and no temporary file behind."""
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, delete=False, prefix=f".{path.name}."
    ) as f:
        try:
            yield f
            f.flush()
            os.fsync(f.fileno())
        except BaseException:
            Path(f.name).unlink(missing_ok=True)
            raise
    make_shareable(Path(f.name))
    os.replace(f.name, path)
    fsync_dir(path.parent)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A hidden temporary file's name beside ``path``, for a writer that takes a name (safetensors'
    ``save_file``): the file becomes ``path`` when the block ends (fsync'ed, given the usual
    permissions, renamed), and an error (or Ctrl-C) inside the block leaves ``path`` as it was and no
    temporary file behind."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    temporary = Path(name)
    try:
        yield temporary
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    make_shareable(temporary)
    os.replace(temporary, path)
    fsync_dir(path.parent)


def open_own(path: Path, mode: str, **options: object) -> IO:
    """``open(path, mode)`` for a file attnkit makes beside others (a lock, a partial download), never
    through a symbolic link: a link planted there in a shared run or data folder would have attnkit
    overwrite whatever it points to. ``mode``: "wb", "ab" or "r+" (created if missing)."""
    try:
        fd = os.open(path, _FLAGS[mode] | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError:
        if path.is_symlink():
            raise AttnkitError(
                f"{path}: a symbolic link; attnkit never writes through one (remove it)"
            ) from None
        raise
    return os.fdopen(fd, mode, **options)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (see :func:`atomic_writer`)."""
    with atomic_writer(path) as f:
        f.write(text)
