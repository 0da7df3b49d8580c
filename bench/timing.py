"""Shared timing for the benchmarks: ours and the peer, interleaved in one process, medians and a ratio.

Interleaving (ours, peer, ours, peer, ...) spreads slow drifts of the machine (frequency, other load)
over both sides instead of charging them to whichever ran second.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from attnkit.cpu.allocator import restart_on_allocator, running
from attnkit.processes import resolve_device


def make_parser(description: str | None) -> argparse.ArgumentParser:
    """A parser with the options every benchmark shares: device, dtype, rounds, threads."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default=resolve_device().type)
    parser.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (GPU default)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds; the median is reported")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    return parser


def resolve_dtype(args: argparse.Namespace) -> torch.dtype:
    name = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    return getattr(torch, name)


def setup(args: argparse.Namespace) -> str:
    """Apply thread settings and describe the machine in one line. First restarts the script on the
    allocator the attnkit command runs on (tcmalloc where found; ATTNKIT_ALLOCATOR), both sides alike."""
    restart_on_allocator()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):
        where = torch.cuda.get_device_name(args.device)
    else:
        where = f"CPU, {torch.get_num_threads()} threads, allocator {running()}"
    return f"torch {torch.__version__}, {where}, dtype {resolve_dtype(args)}"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _seconds_per_call(fn: Callable[[], object], calls: int, device: str) -> float:
    _sync(device)
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return (time.perf_counter() - began) / calls


def compare(
    label: str,
    ours: Callable[[], object],
    peer: Callable[[], object],
    peer_name: str,
    *,
    device: str,
    rounds: int = 7,
    tokens: int | None = None,
    min_seconds: float = 0.2,
) -> float:
    """Time both, print one line with the medians and ``ours/peer time``, and return that ratio."""
    for fn in (ours, peer, ours, peer):  # warm-up: allocator, kernel selection, lazy init
        fn()
    calls = max(1, int(min_seconds / max(_seconds_per_call(ours, 1, device), 1e-6)))
    ours_times, peer_times = [], []
    for _ in range(rounds):
        ours_times.append(_seconds_per_call(ours, calls, device))
        peer_times.append(_seconds_per_call(peer, calls, device))
    ours_s, peer_s = statistics.median(ours_times), statistics.median(peer_times)
    ratio = ours_s / peer_s
    rate = f", ours {tokens / ours_s:,.0f} tok/s, {peer_name} {tokens / peer_s:,.0f} tok/s" if tokens else ""
    print(
        f"{label}: ours {ours_s * 1e3:.3f} ms, {peer_name} {peer_s * 1e3:.3f} ms{rate}; "
        f"ours/{peer_name} time = {ratio:.3f}",
        flush=True,
    )
    return ratio
