"""Where compiled steps are kept between runs, under a key of everything the step depends on, and the
bound on how much they take: steps unused for :data:`MAX_CACHE_DAYS` go, and beyond
:data:`MAX_CACHE_BYTES` the least recently used."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from filelock import FileLock, Timeout

import attnkit
from attnkit.cpu.linear import linear_precision
from attnkit.cpu.precision import cpu_flags

if TYPE_CHECKING:
    from attnkit.models.seq2seq import EncoderDecoder

MAX_CACHE_BYTES = 2 * 2**30  # beyond this the least recently used steps go (each is 1-50 MB)
MAX_CACHE_DAYS = 30  # a step unused for this long goes
BUILD_WAIT_S = 900.0  # the longest a process waits for another's build of the same step before its own
# What the step takes and returns, and how it computes it (trace.py); a new layout gets a new number,
# so that a step cached by an earlier attnkit of the same version string is never called with inputs
# it does not expect, nor gives other bits than this one's (6: the first step's encoder attends as sums;
# 7: the attention pads its keys itself, the sources are not; 8: a bf16 model's maps of 2^16 weights
# and more multiply in bf16; 9: the attention scores only the real keys, its sums still in whole vectors;
# 10: beam search's step ranks the continuations too; 11: cross-attention's query and memory maps, blocks
# of in_proj, multiply in the precision of maps of their size, as the others do, not in float32;
# 12: where bf16 products depend on the rows (AMX), a bf16 map of more than 256 inputs sums by blocks;
# 13: beam search's step rules tokens out where its ranking reads the logits, not over all of them;
# 14: a step attends to its new positions' keys and values as the history holds them, in its dtype).
STEP_LAYOUT = 14


def cpu_capabilities() -> str:
    """The processor the step is compiled for: its architecture, the vector instructions torch uses
    on it, and every instruction-set flag the system reports (Linux: ``/proc/cpuinfo``). Code built for
    a processor with AVX-512 crashes on one without, so a cache folder shared by machines (a home
    folder on a cluster's file system) must keep their steps apart."""
    flags = " ".join(sorted(cpu_flags() or ()))
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{platform.machine()} {platform.processor()} {capability} {flags}"


def cache_key(model: EncoderDecoder, beams: int, serial: bool) -> str:
    """What the compiled step depends on: the weights, the model's settings, the beam width, what its
    linear maps multiply in, whether its loops are serial, its inputs' layout, torch's and attnkit's
    versions, and the processor it runs on."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.step_weights().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    settings = {"config": repr(model.config), "beams": beams, "linear": linear_precision(model),
                "serial": serial, "layout": STEP_LAYOUT, "torch": torch.__version__,
                "attnkit": attnkit.__version__, "cpu": cpu_capabilities()}  # fmt: skip
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:32]


def cache_folder() -> Path:
    """Where compiled steps are kept: ``$XDG_CACHE_HOME/attnkit/steps`` (``~/.cache/attnkit/steps``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnkit" / "steps"


def cached_steps(folder: Path | None = None) -> list[tuple[Path, int, float]]:
    """Each step in the cache: ``(package, bytes with its unpacked library, last used)``, least recently
    used first (a step's package is touched each time it is loaded)."""
    folder = folder or cache_folder()
    steps = []
    for package in folder.glob("*.pt2") if folder.is_dir() else []:
        unpacked = package.with_suffix(".unpacked")
        files = [package, *(unpacked.rglob("*") if unpacked.is_dir() else [])]
        with contextlib.suppress(OSError):  # another process pruned it meanwhile
            size = sum(f.stat().st_size for f in files if f.is_file())
            steps.append((package, size, package.stat().st_mtime))
    return sorted(steps, key=lambda step: step[2])


def build_once(package: Path, build: Callable[[], None]) -> None:
    """``build()``, which writes ``package``, unless the package is there by the time no other process
    builds it: a server's worker processes ask for the same steps as they start, and the same command
    may run twice at once; each building them too cost each process a build's CPU and memory (20-70 s
    a step) for the same file. Processes take turns on a lock file beside the package, and one that
    waits longer than :data:`BUILD_WAIT_S` (its holder hung) builds anyway: packages are written
    atomically, so two builds at once only waste work."""
    lock = FileLock(str(package.with_suffix(".lock")))
    try:
        lock.acquire(timeout=BUILD_WAIT_S)
        held = True
    except Timeout:
        held = False
    try:
        if not package.is_file():
            build()
    finally:
        if held:
            lock.release()


def remove_step(package: Path) -> None:
    """Delete a cached step: its package, its unpacked library (a process still running it keeps its
    copy, which the system frees when the process lets go) and its build's lock file."""
    package.unlink(missing_ok=True)
    package.with_suffix(".lock").unlink(missing_ok=True)
    shutil.rmtree(package.with_suffix(".unpacked"), ignore_errors=True)


def prune_cache(keep: Path | None = None, now: float | None = None) -> list[Path]:
    """Delete the steps unused for :data:`MAX_CACHE_DAYS` days, then the least recently used until the
    cache holds at most :data:`MAX_CACHE_BYTES` (never ``keep``, the step in hand); returns the deleted."""
    now = time.time() if now is None else now
    _remove_abandoned(cache_folder(), now)
    steps = cached_steps()
    total = sum(size for _, size, _ in steps)
    removed = []
    for package, size, used in steps:
        if package == keep:
            continue
        if now - used > MAX_CACHE_DAYS * 86400 or total > MAX_CACHE_BYTES:
            remove_step(package)
            removed.append(package)
            total -= size
    return removed


def _remove_abandoned(folder: Path, now: float) -> None:
    """Delete what builds and unpackings killed midway left (their work folders: ``tmp*`` of
    ``build.build``, ``.*.unpacked.*`` of ``library``; the lock files of builds that wrote no package),
    once a day old: no build takes that long."""
    for work in [*folder.glob("tmp*"), *folder.glob(".*.unpacked.*")] if folder.is_dir() else []:
        with contextlib.suppress(OSError):
            if work.is_dir() and now - work.stat().st_mtime > 86400:
                shutil.rmtree(work, ignore_errors=True)
    for lock in folder.glob("*.lock") if folder.is_dir() else []:
        with contextlib.suppress(OSError):
            if not lock.with_suffix(".pt2").exists() and now - lock.stat().st_mtime > 86400:
                lock.unlink()
