"""Decoding batches side by side on a CPU: several streams, each on its own share of torch's threads.

A decoding step multiplies small matrices (one row per beam) and runs many small operations between
them, with Python in between. Spread over all the threads, each product gains little from the second
thread, and while one thread works through Python the others wait. Run as ``streams`` independent
workers instead, each decoding a whole batch on ``threads // streams`` threads, the cores stay busy:
on 2 cores, two batches at a time on one thread each translated faster than one batch at a time on two
threads, greedy and at beam 5, with the same outputs (``bench/translate_speed.py``; the figures are in
docs/benchmarks.md). CTranslate2 offers the same choice (``inter_threads`` × ``intra_threads``).

The workers share the model (inference only reads it) and each batch's search keeps its own state,
so a batch's result does not depend on the others. PyTorch operations let go of Python's lock while
they compute, which is what lets the streams overlap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

Item = TypeVar("Item")
Result = TypeVar("Result")


def stream_count(requested: int, device: torch.device | str, batches: int) -> int:
    """How many streams to run: ``requested``, or with 0 one per torch thread on a CPU; never more
    than the batches or the threads, and one on other devices (a GPU runs one batch at a time)."""
    if torch.device(device).type != "cpu":
        return 1
    threads = torch.get_num_threads()
    return max(1, min(requested or threads, threads, batches))


def serial_steps(streams: int) -> bool:
    """Whether searches with ``decode.streams`` = ``streams`` take compiled steps of serial loops
    (cpu/compiled/build.py's ``loop_settings``): every setting but one stream, for each stream then
    runs on a share of the threads, one on a machine of as many cores as streams (0, the default: a
    stream per thread); a single stream takes every thread, and steps whose loops share them out. It
    depends on the setting alone, not on the threads a call finds (a server's workers change theirs
    with its load), so that one setting always builds the same steps; a search that only takes what is
    built takes either kind (the same bits)."""
    return streams != 1


def in_streams(work: Callable[[Item], Result], items: Sequence[Item], streams: int) -> Iterator[Result]:
    """``work(item)`` for each item, in order, on ``streams`` threads that split torch's threads
    between them; with one stream, here, on all of them. torch's thread count is as before afterwards."""
    if streams <= 1:
        yield from map(work, items)
        return
    threads = torch.get_num_threads()
    share = max(1, threads // streams)
    pool = ThreadPoolExecutor(streams, initializer=torch.set_num_threads, initargs=(share,))
    try:
        yield from pool.map(work, items)
    finally:
        pool.shutdown(cancel_futures=True)  # after an error, the batches not yet begun are dropped
        torch.set_num_threads(threads)  # the workers' setting is also the count new threads start with


def fill_by_batch(
    work: Callable[[list[int]], Sequence[Result]],
    batches: Sequence[list[int]],
    streams: int,
    into: list[Result],
    progress: Callable[[int], None] | None = None,
) -> list[Result]:
    """``work(batch)`` for each batch of indices, ``streams`` at a time (:func:`in_streams`), each result
    put at its index of ``into``, which is returned; ``progress`` hears each batch's size as it is done."""
    for batch, results in zip(batches, in_streams(work, batches, streams), strict=True):
        for i, result in zip(batch, results, strict=True):
            into[i] = result
        if progress is not None:
            progress(len(batch))
    return into
