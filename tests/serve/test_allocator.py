"""The allocator worker processes start with (cpu/allocator.py): ``auto`` takes tcmalloc, else
jemalloc, else the system's malloc, saying which (and what to install); one asked for that is not here
is an error naming its package; the library is in ``LD_PRELOAD`` only while a process starts; a child
started so has it mapped, and one started otherwise has not."""

import os
import sys
from pathlib import Path

import pytest

from attnkit.cpu import allocator
from attnkit.cpu.allocator import AllocatorNotFoundError, choose, preloaded
from attnkit.serve.worker_process import WorkerProcess
from tests.serve.test_worker_process import Countdown


def _libraries(monkeypatch, present: dict[str, str]) -> None:
    """``find_library`` finds the libraries of ``present`` (a name as it is asked for -> its file)."""
    monkeypatch.setattr(allocator.sys, "platform", "linux")
    monkeypatch.setattr(allocator.ctypes.util, "find_library", present.get)


def test_auto_takes_tcmalloc_then_jemalloc_then_the_systems_malloc(monkeypatch):
    _libraries(monkeypatch, {"tcmalloc_minimal": "libtcmalloc_minimal.so.4", "jemalloc": "libjemalloc.so.2"})
    assert choose("auto") == (
        "libtcmalloc_minimal.so.4",
        "worker processes: tcmalloc (libtcmalloc_minimal.so.4)",
    )
    _libraries(monkeypatch, {"tcmalloc": "libtcmalloc.so.4", "jemalloc": "libjemalloc.so.2"})
    assert choose("auto")[0] == "libtcmalloc.so.4"  # tcmalloc's full library where the minimal is not
    _libraries(monkeypatch, {"jemalloc": "libjemalloc.so.2"})
    assert choose("auto")[0] == "libjemalloc.so.2"
    assert choose("jemalloc")[0] == "libjemalloc.so.2"
    _libraries(monkeypatch, {})
    library, line = choose("auto")
    assert library is None and "system's malloc" in line and "apt-get install libtcmalloc-minimal4" in line
    assert choose("system")[0] is None


def test_an_allocator_asked_for_that_is_not_here_is_an_error_naming_its_package(monkeypatch):
    _libraries(monkeypatch, {"jemalloc": "libjemalloc.so.2"})
    with pytest.raises(
        AllocatorNotFoundError, match=r"--allocator tcmalloc: not found.*libtcmalloc-minimal4"
    ):
        choose("tcmalloc")
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert choose("auto")[0] is None  # no LD_PRELOAD to preload with: the system's
    with pytest.raises(AllocatorNotFoundError, match="Linux only"):
        choose("jemalloc")


def test_the_library_is_preloaded_only_while_processes_start(monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    with preloaded("libone.so"):
        assert os.environ["LD_PRELOAD"] == "libone.so"
    assert "LD_PRELOAD" not in os.environ
    monkeypatch.setenv("LD_PRELOAD", "libtheirs.so")
    with preloaded("libone.so"):
        assert os.environ["LD_PRELOAD"] == "libone.so libtheirs.so"  # before what was there
    assert os.environ["LD_PRELOAD"] == "libtheirs.so"
    with preloaded(None):
        assert os.environ["LD_PRELOAD"] == "libtheirs.so"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD and /proc are Linux's")
def test_a_worker_process_starts_with_the_allocator_it_is_given():
    library, _ = choose("auto")
    if library is None:
        pytest.skip("no tcmalloc or jemalloc here (apt-get install libtcmalloc-minimal4)")
    if library in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("this process was started with it preloaded already")
    name = Path(library).name
    given, plain = WorkerProcess(Countdown, preload=library), WorkerProcess(Countdown)
    try:
        assert given.iterate([(1, f"mapped:{name}", None)], set()) == [(1, "MAPPED")]
        assert plain.iterate([(1, f"mapped:{name}", None)], set()) == [(1, "NOT MAPPED")]
    finally:
        given.close()
        plain.close()
    assert name not in Path("/proc/self/maps").read_text(encoding="utf-8")  # this process keeps its own
    assert library not in os.environ.get("LD_PRELOAD", "")
