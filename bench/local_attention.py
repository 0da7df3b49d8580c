"""Local (sliding-window) self-attention against full attention at long lengths: time and memory.

For each length, one multi-head self-attention layer (d_model 256, 4 heads, batch 1, no dropout) runs
forward and backward three ways on the same inputs and weights:

- ``full``: every query sees every key (``F.scaled_dot_product_attention``, no mask): the peer;
- ``band``: the window as a banded ``T × T`` boolean mask given to the same kernel: exact, but all
  ``T²`` scores are still computed;
- ``blocked``: attnkit's fast path for a window (``attention/local.py``), blocks of ``w`` queries
  against their ``3w`` keys: ``O(T·w)``.

Time is the median of interleaved rounds (bench/timing.py); memory is the peak of the allocations the
attention makes, measured by the PyTorch profiler on CPU (``torch.cuda.max_memory_allocated`` on a GPU).
Run: ``python bench/local_attention.py [--lengths 1024 4096] [--window 128]``.
"""

from __future__ import annotations

import torch
from timing import compare, make_parser, resolve_dtype, setup
from torch.profiler import ProfilerActivity, profile

from attnkit.attention.local import attend_local
from attnkit.attention.masks import local_window_mask


def _peak_bytes(fn, device: str) -> int:
    """Peak bytes allocated while ``fn`` runs (above what was allocated before)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live, peak = 0, 0
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    for event in events:  # allocations and frees in time order
        live += event.self_cpu_memory_usage  # self: a parent op does not count its children again
        peak = max(peak, live)
    return peak


def _variants(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, band: torch.Tensor, window: int):
    """Forward and backward of full, banded-mask and blocked attention on the same inputs."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return (
        lambda: sdpa(q, k, v).sum().backward(),
        lambda: sdpa(q, k, v, attn_mask=band).sum().backward(),
        lambda: attend_local(q, k, v, window).sum().backward(),
    )


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--window", type=int, default=128)
    args = parser.parse_args()
    print(setup(args) + f"; window {args.window}, d_model 256, 4 heads, batch 1, forward + backward")
    dtype, device, w = resolve_dtype(args), args.device, args.window
    for length in args.lengths:
        torch.manual_seed(0)
        q, k, v = (
            torch.randn(1, 4, length, 64, device=device, dtype=dtype, requires_grad=True) for _ in range(3)
        )
        band = local_window_mask(length, window=w, device=device)

        full, banded, blocked = _variants(q, k, v, band, w)
        tokens = length
        compare(f"T={length} blocked vs full", blocked, full, "full", device=device, rounds=args.rounds,
                tokens=tokens)  # fmt: skip
        compare(f"T={length} band vs full", banded, full, "full", device=device, rounds=args.rounds,
                tokens=tokens)  # fmt: skip
        peaks = {name: _peak_bytes(fn, device) / 2**20 for name, fn in
                 (("full", full), ("band", banded), ("blocked", blocked))}  # fmt: skip
        print(f"T={length} peak MiB: " + ", ".join(f"{n} {p:.1f}" for n, p in peaks.items())
              + f"; blocked/full memory = {peaks['blocked'] / peaks['full']:.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
