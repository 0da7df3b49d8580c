"""Which number formats this CPU multiplies matrices fast in: bf16 and int8 where it has the units for
them (Intel's AMX tiles, AVX512-BF16, AVX512-VNNI; Arm's BF16 and I8MM), float32 everywhere.

Why it matters: a processor with bf16 matrix units multiplies bf16 matrices several times faster than
float32 ones, through the same oneDNN kernels torch already ships; one without them emulates bf16 and
gains nothing (or loses). So ``auto`` asks :func:`matrix_units` whether bf16 pays on this CPU, for
training (``attnkit.train.precision``: the run's first line says so) and for inference
(``attnkit.loading.inference_precision``: ``decode.precision``).

Why a probe and not a list of processor names: the instruction flags say whether the units exist (Linux's
``/proc/cpuinfo``; where the system does not say, they are taken to be there and the product decides),
and one timed product of two 512 x 512 matrices in each format says whether this build of torch reaches
them (about 30 ms, once per process). A format counts as fast when its product is at least
:data:`FAST_ENOUGH` times float32's.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import torch

FAST_ENOUGH = 1.5  # how many times float32's speed a bf16 product must reach to be worth training in
BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")  # x86's AMX and AVX-512 bf16; Arm's BF16 ("bf16")
INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni", "i8mm")  # x86's AMX, VNNI; Arm's I8MM


@dataclass(frozen=True)
class MatrixUnits:
    """What :func:`matrix_units` found: whether bf16 products are fast here, how much faster than
    float32 they ran, and the flags the system reported (None where it reports none)."""

    bf16: bool
    bf16_speedup: float  # bf16 product's speed / float32's (0.0: not measured, no units)
    bf16_flags: tuple[str, ...] | None
    int8_flags: tuple[str, ...] | None

    @property
    def why(self) -> str:
        """One line for a run's log: the bf16 instructions found, and how fast a bf16 product ran."""
        flags = "the system lists no CPU flags" if self.bf16_flags is None else (
            ", ".join(self.bf16_flags) or "no bf16 matrix instructions (amx_bf16, avx512_bf16)")  # fmt: skip
        if not self.bf16_speedup:
            return f"this CPU has {flags}"
        return f"this CPU has {flags}; a bf16 matrix product ran {self.bf16_speedup:.1f}x float32's speed"


def cpu_flags() -> set[str] | None:
    """The instruction-set flags the system lists for the processor (Linux: ``flags`` or ``Features``
    in ``/proc/cpuinfo``); None where it lists none (macOS, Windows)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.partition(":")[2].split())
    return None


def _speed(dtype: torch.dtype, size: int = 512, repeats: int = 8) -> float:
    """Products of two ``size x size`` matrices of ``dtype`` a second, the best of ``repeats`` runs
    (after one untimed, which lets oneDNN pick and compile its kernel)."""
    a = torch.ones(size, size, dtype=dtype)
    b = torch.ones(size, size, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - began)
    return 1.0 / max(best, 1e-9)


@functools.cache
def matrix_units() -> MatrixUnits:
    """This CPU's fast formats (see the module docstring); measured once per process."""
    flags = cpu_flags()
    bf16_flags = None if flags is None else tuple(sorted(flags & set(BF16_FLAGS)))
    int8_flags = None if flags is None else tuple(sorted(flags & set(INT8_FLAGS)))
    if bf16_flags == () or not torch.backends.mkldnn.is_available():
        return MatrixUnits(False, 0.0, bf16_flags, int8_flags)
    speedup = _speed(torch.bfloat16) / _speed(torch.float32)
    return MatrixUnits(speedup >= FAST_ENOUGH, speedup, bf16_flags, int8_flags)
