"""decode.steps' cache of compiled steps: keyed on the processor too (a step built for AVX-512 is
never loaded on a machine without it), bounded in age and size, and emptied by ``attnkit cache clear``.
None of this compiles anything, so it runs without a C++ compiler."""

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
    compiled.prune_cache(keep=kept)
    assert sorted(p.name for p in cache.iterdir()) == ["kept.pt2", "kept.unpacked", "tmpfresh"]


def test_cache_info_and_clear(cache):
    _step(cache, "a", 1, days_ago=0)
    _step(cache, "b", 2, days_ago=1)
    runner = CliRunner()
    info = runner.invoke(app, ["cache", "info"])
    assert info.exit_code == 0 and f"{cache}: 2 compiled step(s), 3.0 MiB" in info.output
    cleared = runner.invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0 and "deleted 2 compiled step(s), 3.0 MiB" in cleared.output
    assert list(cache.iterdir()) == []
