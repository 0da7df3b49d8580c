"""The memory allocator the engine's worker processes start with (``attnkit serve --allocator``).

A decoding step makes and frees hundreds of small tensors, and glibc's ``malloc`` is slow at that: it
took 14% of a running batch's newcomers' first steps (``perf``). With tcmalloc preloaded, a running
batch of 32 clients on the Multi30k model decoded 15% more sentences a second (6.1 against 7.0 ms a
sentence, in process on one thread; jemalloc: 9%), as Intel's own guides for PyTorch on CPUs advise.

A process cannot change its allocator once it runs, but the worker processes (serve/worker_process.py) are
started by the server: each starts with the library in ``LD_PRELOAD``, which the dynamic loader reads
when the process begins (Linux; the server's own process keeps the system's). :func:`choose` finds
the library; ``auto`` takes tcmalloc, else jemalloc, else the system's ``malloc``, saying so and what
it costs.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import sys
import threading
from collections.abc import Iterator

# each allocator's libraries, as ``ctypes.util.find_library`` names them, the first found taken (tcmalloc's
# minimal library: its allocator without the heap profiler); and Debian's package of each
LIBRARIES = {"tcmalloc": ("tcmalloc_minimal", "tcmalloc"), "jemalloc": ("jemalloc",)}
PACKAGES = {"tcmalloc": "libtcmalloc-minimal4", "jemalloc": "libjemalloc2"}
ALLOCATORS = ("auto", *LIBRARIES, "system")

_STARTING = threading.Lock()  # one process started at a time while LD_PRELOAD names the library


class AllocatorNotFoundError(RuntimeError):
    """The allocator asked for is not on this system (or the system has no ``LD_PRELOAD``)."""


def choose(allocator: str) -> tuple[str | None, str]:
    """The library that worker processes preload for ``allocator`` (one of :data:`ALLOCATORS`; None:
    the system's ``malloc``) and a line for the log saying which serves."""
    if allocator == "system":
        return None, "worker processes: the system's malloc (--allocator system)"
    wanted = list(LIBRARIES) if allocator == "auto" else [allocator]
    if not sys.platform.startswith("linux"):
        if allocator == "auto":
            return None, "worker processes: the system's malloc (preloading another is Linux's)"
        raise AllocatorNotFoundError(f"--allocator {allocator}: preloading an allocator works on Linux only")
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
        f"--allocator {allocator}: not found on this system (Debian: apt-get install {PACKAGES[allocator]})"
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
