"""The memory allocator attnkit's processes run on: tcmalloc where the system has it.

A decoding or training step makes and frees hundreds of small tensors, and glibc's ``malloc`` is slow at
that: it took 14% of a running batch's newcomers' first steps (``perf``). With tcmalloc preloaded, a
running batch of 32 clients on the Multi30k model decoded 15% more sentences a second (6.1 against 7.0
ms a sentence, in process on one thread; jemalloc: 9%), ``attnkit translate`` 1.19x, and a bf16 training
step of the small preset took 150 against 175 ms, as Intel's own guides for PyTorch on CPUs advise.

A process cannot change its allocator once it runs: the dynamic loader reads ``LD_PRELOAD`` when a
process begins (Linux). So

- the ``attnkit`` command restarts itself once, before torch loads, with the library preloaded
  (:func:`restart_on_allocator`; ``ATTNKIT_ALLOCATOR=auto|tcmalloc|jemalloc|system``, default ``auto``;
  an allocator preloaded already is kept), and gives the processes it starts the environment it was
  given;
- the server's worker processes (serve/worker_process.py) start with the library that ``attnkit serve
  --allocator`` chose in ``LD_PRELOAD`` (:func:`preloaded`).

:func:`choose` finds the library: ``auto`` takes tcmalloc, else jemalloc, else the system's ``malloc``.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

# each allocator's libraries, as ``ctypes.util.find_library`` names them, the first found taken (tcmalloc's
# minimal library: its allocator without the heap profiler); and Debian's package of each
LIBRARIES = {"tcmalloc": ("tcmalloc_minimal", "tcmalloc"), "jemalloc": ("jemalloc",)}
PACKAGES = {"tcmalloc": "libtcmalloc-minimal4", "jemalloc": "libjemalloc2"}
ALLOCATORS = ("auto", *LIBRARIES, "system")
SETTING = "ATTNKIT_ALLOCATOR"  # the attnkit command's own allocator, one of ALLOCATORS (default auto)
# set for the process that the command restarts as: the LD_PRELOAD it was given, given back to its children
_GIVEN_PRELOAD = "_ATTNKIT_GIVEN_LD_PRELOAD"

_STARTING = threading.Lock()  # one process started at a time while LD_PRELOAD names the library


class AllocatorNotFoundError(RuntimeError):
    """The allocator asked for is not on this system (or the system has no ``LD_PRELOAD``)."""


def choose(allocator: str, setting: str = "--allocator") -> tuple[str | None, str]:
    """The library that worker processes preload for ``allocator`` (one of :data:`ALLOCATORS`; None:
    the system's ``malloc``) and a line for the log saying which serves; errors name ``setting``."""
    if allocator not in ALLOCATORS:
        raise AllocatorNotFoundError(f"{setting}={allocator}: choose one of {', '.join(ALLOCATORS)}")
    if allocator == "system":
        return None, "worker processes: the system's malloc (--allocator system)"
    wanted = list(LIBRARIES) if allocator == "auto" else [allocator]
    if not sys.platform.startswith("linux"):
        if allocator == "auto":
            return None, "worker processes: the system's malloc (preloading another is Linux's)"
        raise AllocatorNotFoundError(f"{setting}={allocator}: preloading an allocator works on Linux only")
    for name in wanted:
        for library in LIBRARIES[name]:
            found = ctypes.util.find_library(library)
            if found:
                return found, f"worker processes: {name} ({found})"
    if allocator == "auto":
        return None, (
            "worker processes: the system's malloc, no tcmalloc or jemalloc found (with tcmalloc a running "
            f"batch decoded ~15% faster: apt-get install {PACKAGES['tcmalloc']})"
        )
    raise AllocatorNotFoundError(
        f"{setting}={allocator}: not found on this system (Debian: apt-get install {PACKAGES[allocator]})"
    )


@contextlib.contextmanager
def preloaded(library: str | None) -> Iterator[None]:
    """Processes started in this block start with ``library`` preloaded (before any ``LD_PRELOAD`` there
    was, which comes back after); nothing where ``library`` is None."""
    if library is None:
        yield
        return
    with _STARTING:
        before = os.environ.get("LD_PRELOAD")
        os.environ["LD_PRELOAD"] = f"{library} {before}" if before else library
        try:
            yield
        finally:
            if before is None:
                del os.environ["LD_PRELOAD"]
            else:
                os.environ["LD_PRELOAD"] = before


def running() -> str:
    """The allocator this process runs on, from the libraries it has mapped: ``tcmalloc``, ``jemalloc``
    or ``system``."""
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8")
    except OSError:  # no /proc: not Linux, where nothing is preloaded
        return "system"
    for name, libraries in LIBRARIES.items():
        if any(f"/lib{library}.so" in maps for library in libraries):
            return name
    return "system"


def chosen() -> str | None:
    """The library that ``ATTNKIT_ALLOCATOR`` names (:func:`choose`; None: the system's ``malloc``)."""
    return choose(os.environ.get(SETTING, "auto"), SETTING)[0]


def restart_on_allocator() -> None:
    """Restart this program (``sys.orig_argv``: the same interpreter, options and arguments) with the
    allocator that ``ATTNKIT_ALLOCATOR`` names preloaded, where it runs on the system's ``malloc`` and
    that is another; in the process restarted, give ``LD_PRELOAD`` back as it was, so that the
    processes it starts (compilers, worker processes, browsers) start as they would have.

    Call it first thing, before torch loads: ``os.execve`` keeps the process (its id, open files,
    signals) and replaces the program, which costs the interpreter's start again (~30 ms here)."""
    if _GIVEN_PRELOAD in os.environ:  # restarted already (or the loader refused the library: go on)
        given = os.environ.pop(_GIVEN_PRELOAD)
        if given:
            os.environ["LD_PRELOAD"] = given
        else:
            os.environ.pop("LD_PRELOAD", None)
        return
    library = chosen()
    if library is None or running() != "system" or not sys.executable:
        return
    given = os.environ.get("LD_PRELOAD", "")
    environment = {**os.environ, "LD_PRELOAD": f"{library} {given}".strip(), _GIVEN_PRELOAD: given}
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment)
    except OSError:  # cannot restart: go on as started
        return
