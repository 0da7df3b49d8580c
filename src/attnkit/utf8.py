"""UTF-8 whatever the locale.

attnkit reads and writes every text as UTF-8: files (each ``open``/``read_text``/``write_text`` names
its encoding, which tests/test_text_encoding.py checks), stdin (read as bytes, data/readers.py) and,
through :func:`use_utf8_streams`, stdout and stderr. Under the C locale (a minimal container, a cron
job) Python's defaults are ASCII instead: German text would crash the first ``print`` and a non-ASCII
file name arrives as escape characters (``surrogateescape``), which Python's own file functions turn
back into the right bytes, but libraries written in Rust or C++ refuse. Those get
:func:`native_path`, and text taken from the command line gets :func:`command_line_text`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def use_utf8_streams() -> None:
    """Write stdout and stderr as UTF-8 (an escaped byte of a file name as that byte again)."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and stream.encoding.lower().replace("-", "") != "utf8":
            stream.reconfigure(encoding="utf-8", errors="surrogateescape")


def command_line_text(text: str) -> str:
    """A text argument (``--text``, a prompt) as the UTF-8 the terminal sent, not as the locale read it."""
    try:
        return os.fsencode(text).decode("utf-8")
    except UnicodeError:  # not UTF-8 bytes after all: keep what the locale made of them
        return text


def native_path(path: str | Path) -> str:
    """``path`` as plain text for a library that takes a path as UTF-8 (tokenizers, CTranslate2): the
    same decoding as :func:`command_line_text`, a file name being the bytes the system holds."""
    return command_line_text(os.fspath(path))
