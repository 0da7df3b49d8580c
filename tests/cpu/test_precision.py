"""The probe of the CPU's matrix units (cpu/precision.py): bf16 counts as fast only where the system lists
a bf16 matrix instruction and a timed product confirms it; nothing is timed where the units are absent."""

import sys

import pytest

from attnkit.cpu import precision


@pytest.fixture
def fresh(monkeypatch):
    """A probe that has not run yet in this process (it is cached), and forgets what it finds."""
    precision.matrix_units.cache_clear()
    yield monkeypatch
    precision.matrix_units.cache_clear()


def _timed(monkeypatch, speeds):
    """Products that take the given speeds (bf16, float32), counted."""
    calls = []

    def speed(dtype, *args):
        calls.append(dtype)
        return speeds[0] if dtype == precision.torch.bfloat16 else speeds[1]

    monkeypatch.setattr(precision, "_speed", speed)
    return calls


def test_a_cpu_without_bf16_instructions_is_not_timed_and_keeps_float32(fresh):
    fresh.setattr(precision, "cpu_flags", lambda: {"sse2", "avx2", "avx512f", "avx512_vnni"})
    calls = _timed(fresh, (10.0, 1.0))
    units = precision.matrix_units()
    assert not units.bf16 and calls == []
    assert units.int8_flags == ("avx512_vnni",)
    assert "no bf16 matrix instructions" in units.why


@pytest.mark.parametrize(("speeds", "fast"), [((4.0, 1.0), True), ((1.2, 1.0), False)],
                         ids=["4x float32: bf16", "1.2x: float32"])  # fmt: skip
def test_bf16_counts_as_fast_only_when_its_product_is_fast_enough(fresh, speeds, fast):
    fresh.setattr(precision, "cpu_flags", lambda: {"avx512f", "amx_tile", "amx_bf16", "avx512_bf16"})
    _timed(fresh, speeds)
    units = precision.matrix_units()
    assert units.bf16 is fast and units.bf16_speedup == pytest.approx(speeds[0] / speeds[1])
    assert units.bf16_flags == ("amx_bf16", "avx512_bf16")
    assert f"ran {speeds[0] / speeds[1]:.1f}x float32's speed" in units.why


def test_a_system_that_lists_no_flags_lets_the_timed_product_decide(fresh):
    fresh.setattr(precision, "cpu_flags", lambda: None)
    calls = _timed(fresh, (3.0, 1.0))
    units = precision.matrix_units()
    assert units.bf16 and units.bf16_flags is None and len(calls) == 2
    assert "the system lists no CPU flags" in units.why


def test_the_probe_runs_once_per_process(fresh):
    fresh.setattr(precision, "cpu_flags", lambda: {"amx_bf16"})
    calls = _timed(fresh, (3.0, 1.0))
    assert precision.matrix_units() is precision.matrix_units() and len(calls) == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo (Linux)")
def test_the_flags_are_read_from_the_system():
    flags = precision.cpu_flags()
    assert flags and all(flag == flag.strip() and flag for flag in flags)


def test_timing_a_real_product_gives_a_positive_speed():
    assert precision._speed(precision.torch.float32, size=64, repeats=2) > 0
