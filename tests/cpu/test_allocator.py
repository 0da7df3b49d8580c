"""The allocator attnkit's processes run on (cpu/allocator.py): ``auto`` takes tcmalloc, else jemalloc,
else the system's malloc, saying which (and what to install); one asked for that is not here is an
error naming its package. The ``attnkit`` command restarts itself once on it, before torch loads, and
gives its children the ``LD_PRELOAD`` it was given; the server's worker processes start with it, the
library in ``LD_PRELOAD`` only while a process starts."""

import os
import subprocess
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
        AllocatorNotFoundError, match=r"--allocator=tcmalloc: not found.*libtcmalloc-minimal4"
    ):
        choose("tcmalloc")
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert choose("auto")[0] is None  # no LD_PRELOAD to preload with: the system's
    with pytest.raises(AllocatorNotFoundError, match="Linux only"):
        choose("jemalloc")


def test_an_allocator_of_no_known_name_is_one_line_naming_the_setting_and_the_choices():
    """Whoever asks (the server's --allocator, the command's ATTNKIT_ALLOCATOR, a script), a name that
    is none of the allocators is an error saying the choices, not a KeyError from the library table."""
    for setting in ("--allocator", allocator.SETTING):
        with pytest.raises(AllocatorNotFoundError, match=f"^{setting}=hoard: choose one of auto, tcmalloc, "):
            choose("hoard", setting)


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


def _restarts(monkeypatch, mapped: str = "system") -> list:
    """Each ``os.execve`` that :func:`restart_on_allocator` would make, as ``(program, argv, environment)``,
    in a process on the ``mapped`` allocator where tcmalloc and jemalloc are found."""
    _libraries(monkeypatch, {"tcmalloc_minimal": "libtcmalloc_minimal.so.4", "jemalloc": "libjemalloc.so.2"})
    monkeypatch.setattr(allocator, "running", lambda: mapped)
    made = []
    monkeypatch.setattr(allocator.os, "execve", lambda *call: made.append(call))
    return made


def test_the_command_restarts_as_it_was_started_with_the_allocator_before_what_was_preloaded(monkeypatch):
    made = _restarts(monkeypatch)
    monkeypatch.delenv(allocator.SETTING, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "libtheirs.so")
    allocator.restart_on_allocator()
    [(program, argv, environment)] = made
    assert program == sys.executable and argv == [sys.executable, *sys.orig_argv[1:]]
    assert environment["LD_PRELOAD"] == "libtcmalloc_minimal.so.4 libtheirs.so"
    made.clear()
    monkeypatch.setenv(allocator.SETTING, "jemalloc")
    monkeypatch.delenv("LD_PRELOAD")
    allocator.restart_on_allocator()
    assert made[0][2]["LD_PRELOAD"] == "libjemalloc.so.2"


def test_the_command_stays_on_the_systems_malloc_or_on_one_preloaded_already(monkeypatch):
    made = _restarts(monkeypatch)
    monkeypatch.setenv(allocator.SETTING, "system")
    allocator.restart_on_allocator()
    made_by_jemalloc = _restarts(monkeypatch, mapped="jemalloc")
    monkeypatch.setenv(allocator.SETTING, "auto")
    allocator.restart_on_allocator()
    assert made == [] and made_by_jemalloc == []
    monkeypatch.setenv(allocator.SETTING, "hoard")
    with pytest.raises(AllocatorNotFoundError, match="ATTNKIT_ALLOCATOR=hoard: choose one of auto, tcmalloc"):
        allocator.restart_on_allocator()


def test_the_restarted_command_gives_its_children_the_preload_it_was_given(monkeypatch):
    made = _restarts(monkeypatch)
    for given in ("", "libtheirs.so"):
        monkeypatch.setenv("LD_PRELOAD", f"libtcmalloc_minimal.so.4 {given}".strip())
        monkeypatch.setenv(allocator._GIVEN_PRELOAD, given)
        allocator.restart_on_allocator()  # this is the restarted process (even where the loader refused)
        assert os.environ.get("LD_PRELOAD") == (given or None)
        assert allocator._GIVEN_PRELOAD not in os.environ
    assert made == []


def test_the_package_and_its_command_line_import_without_torch():
    """What the command reads before it restarts: torch (~1 s) is imported after, once."""
    imports = "import sys, attnkit, attnkit.cli, attnkit.cpu.allocator"
    code = f"{imports}; print([m for m in sys.modules if 'torch' in m])"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, encoding="utf-8", check=True)
    assert imported.stdout == "[]\n"


def _summary(setting: str | None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator.SETTING)}
    if setting is not None:
        environment[allocator.SETTING] = setting
    command = [sys.executable, "-m", "attnkit", "summary", "--preset", "tiny", "--vocab", "50"]
    return subprocess.run(command, capture_output=True, encoding="utf-8", env=environment)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD and /proc are Linux's")
def test_the_attnkit_command_runs_on_tcmalloc_where_the_system_has_it():
    library, _ = choose("auto")
    if library is None:
        pytest.skip("no tcmalloc or jemalloc here (apt-get install libtcmalloc-minimal4)")
    name = "tcmalloc" if "tcmalloc" in library else "jemalloc"
    assert f"allocator: {name})" in _summary(None).stdout
    assert "allocator: system)" in _summary("system").stdout
    wrong = _summary("hoard")
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines() == [
        "attnkit: error: ATTNKIT_ALLOCATOR=hoard: choose one of auto, tcmalloc, jemalloc, system"
    ]
