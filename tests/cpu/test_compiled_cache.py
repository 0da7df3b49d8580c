"""decode.steps' cache of compiled steps: keyed on the processor too (a step built for AVX-512 is
never loaded on a machine without it), bounded in age and size, and emptied by ``attnkit cache clear``;
a step that another process builds is waited for, not built twice. None of this compiles anything, so
it runs without a C++ compiler."""

import os
import time

import pytest
import torch
from typer.testing import CliRunner

from attnkit import build_transformer
from attnkit.cli import app
from attnkit.cpu.compiled import cache as compiled
from attnkit.models.config import TransformerConfig


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = compiled.cache_folder()
    folder.mkdir(parents=True)
    return folder


def _step(folder, name: str, megabytes: float, days_ago: float):
    """A cached step as compiled_step leaves it: the package and its unpacked library, last used then."""
    package = folder / f"{name}.pt2"
    package.write_bytes(b"p" * int(megabytes * 2**20 / 2))
    library = folder / f"{name}.unpacked" / name / "data" / "aotinductor" / "model" / "step.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"s" * int(megabytes * 2**20 / 2))
    used = time.time() - days_ago * 86400
    os.utime(package, (used, used))
    return package


def test_the_key_holds_the_processor(monkeypatch):
    torch.manual_seed(0)
    model = build_transformer("tiny", 20)
    here = compiled.cache_key(model, 3, serial=True)
    assert compiled.cache_key(model, 3, serial=True) == here  # the same machine: the same step
    assert compiled.cache_key(model, 3, serial=False) != here  # loops for other threads: another step
    assert "avx" in compiled.cpu_capabilities().lower() or os.uname().machine != "x86_64"
    monkeypatch.setattr(compiled, "cpu_capabilities", lambda: "x86_64 sse2 only")
    assert compiled.cache_key(model, 3, serial=True) != here  # another instruction set: another step


def test_the_key_holds_what_the_linear_maps_multiply_in():
    """A model whose maps multiply bf16 copies or int8 weights compiles a step of its own: the weights
    (the state dict) are the same, and an int8 model once loaded the float32 step in their place."""
    from attnkit.cpu import pack_for_inference, quantize_int8, speed_up
    from attnkit.cpu.linear import _packing_works

    keys = set()
    for precision in ("fp32", "bf16", "int8"):
        torch.manual_seed(0)
        model = build_transformer(TransformerConfig.from_preset("tiny", d_model=256, d_ff=1024), 30).eval()
        speed_up(model, inference=precision == "fp32")
        if precision == "bf16":
            pack_for_inference(model, torch.bfloat16)
        elif precision == "int8":
            quantize_int8(model)
        keys.add(compiled.cache_key(model, 3, serial=True))
    assert len(keys) == (3 if _packing_works(torch.bfloat16) else 2)  # without bf16 copies, bf16 is fp32


def test_the_cache_drops_old_steps_then_the_least_recently_used_beyond_its_size(cache, monkeypatch):
    monkeypatch.setattr(compiled, "MAX_CACHE_BYTES", 10 * 2**20)
    old = _step(cache, "old", 1, days_ago=31)
    lru = _step(cache, "lru", 4, days_ago=3)
    mid = _step(cache, "mid", 4, days_ago=2)
    new = _step(cache, "new", 4, days_ago=0)
    assert [p for p, _, _ in compiled.cached_steps()] == [old, lru, mid, new]
    removed = compiled.prune_cache(keep=new)
    assert removed == [old, lru]  # unused for 31 days; then 12 MiB > 10 MiB: the least recently used
    assert sorted(p.name for p in cache.iterdir()) == ["mid.pt2", "mid.unpacked", "new.pt2", "new.unpacked"]
    monkeypatch.setattr(compiled, "MAX_CACHE_BYTES", 1)
    assert compiled.prune_cache(keep=new) == [mid]  # never the step in hand
    assert [p for p, _, _ in compiled.cached_steps()] == [new]


def test_the_cache_drops_what_a_killed_build_left_once_it_is_a_day_old(cache):
    """A build killed midway (a server stopped while its steps built in the background) leaves its work
    folder; the next prune deletes it once no build could still be writing it."""
    kept = _step(cache, "kept", 1, days_ago=0)
    work = {name: cache / name for name in ("tmpab12cd", ".kept.unpacked.x1y2", "tmpfresh")}
    for name, folder in work.items():
        (folder / "part").mkdir(parents=True)
        if name != "tmpfresh":
            os.utime(folder, (time.time() - 2 * 86400,) * 2)
    for name in ("kept.lock", "failed.lock", "fresh.lock"):  # a build's lock; one that wrote nothing
        (cache / name).touch()
        if name != "fresh.lock":
            os.utime(cache / name, (time.time() - 2 * 86400,) * 2)
    compiled.prune_cache(keep=kept)
    left = ["fresh.lock", "kept.lock", "kept.pt2", "kept.unpacked", "tmpfresh"]
    assert sorted(p.name for p in cache.iterdir()) == left


_HOLD = """
import sys, time
from pathlib import Path
from filelock import FileLock
package = Path(sys.argv[1])
with FileLock(str(package.with_suffix(".lock"))):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    if sys.argv[3] == "writes":
        package.write_bytes(b"built by the other process")
"""


def _holding(package, seconds: float, writes: bool):
    """Another process that holds the build lock of ``package`` for ``seconds``, then writes it (or
    not), as a build in another process does; returned once it holds the lock."""
    import subprocess
    import sys

    command = [sys.executable, "-c", _HOLD, str(package), str(seconds), "writes" if writes else "-"]
    holder = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, encoding="utf-8")
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_step_another_process_builds_is_waited_for_and_not_built_again(cache):
    package = cache / "step.pt2"
    builds = []
    holder = _holding(package, 1.5, writes=True)
    began = time.monotonic()
    compiled.build_once(package, lambda: builds.append(1))
    assert holder.wait() == 0 and time.monotonic() - began > 1.0  # it waited for the other build
    assert builds == [] and package.read_bytes() == b"built by the other process"
    compiled.build_once(cache / "other.pt2", lambda: builds.append(2))
    assert builds == [2]  # nobody else building it: built here


def test_a_build_that_another_process_did_not_finish_or_holds_too_long_is_built_here(cache, monkeypatch):
    package = cache / "step.pt2"
    builds = []
    holder = _holding(package, 0.5, writes=False)  # a build that failed: no package
    compiled.build_once(package, lambda: builds.append(1))
    assert holder.wait() == 0 and builds == [1]
    monkeypatch.setattr(compiled, "BUILD_WAIT_S", 0.5)
    holder = _holding(package.with_name("hung.pt2"), 30, writes=False)  # a holder that hangs
    try:
        began = time.monotonic()
        compiled.build_once(package.with_name("hung.pt2"), lambda: builds.append(2))
        assert builds == [1, 2] and time.monotonic() - began < 10
    finally:
        holder.kill()
        holder.wait()


def test_cache_info_and_clear(cache):
    _step(cache, "a", 1, days_ago=0)
    _step(cache, "b", 2, days_ago=1)
    runner = CliRunner()
    info = runner.invoke(app, ["cache", "info"])
    assert info.exit_code == 0 and f"{cache}: 2 compiled step(s), 3.0 MiB" in info.output
    cleared = runner.invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0 and "deleted 2 compiled step(s), 3.0 MiB" in cleared.output
    assert list(cache.iterdir()) == []
