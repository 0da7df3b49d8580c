"""The engine alone: attnkit's running batches (continuous batching) driven in this process by simulated
clients, with no HTTP, against ``attnkit translate`` of the same sentences offline.

A server's throughput is the engine's less what the HTTP layer costs (parsing, JSON, tokenising, the
hops between threads). This measures the engine alone, laid out as ``attnkit serve`` lays it out with
the same options: its running batches in engine processes (or on threads, ``--workers threads``), one
worker thread driving each, every worker on its share of torch's threads. Each of ``--clients``
simulated clients has one sentence in flight and sends the next as soon as the last is done (a closed
loop, as ``bench/serve_load.py``'s clients); a worker admits every sentence waiting at each step,
as the server's continuous batcher does when nothing is over its budget. For each level it prints
sentences/s, its share of the offline throughput (the per-core efficiency of continuous batching),
the latency from a sentence's arrival to its translation, and how many answers are not the offline
ones (each sentence's translation must not depend on what shares its steps).

``bench/serve_load.py --engine-only`` runs this beside the server, on the same sentences, and prints the
HTTP layer's share of the cost; run alone:
``python bench/engine_load.py --ckpt RUN --data data/multi30k`` (a translation checkpoint; extra
``decode.field=value`` arguments are the server's decoding settings).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import statistics
import threading
import time
from collections import deque
from pathlib import Path

import torch

from attnkit.decode.search import BeamSettings

NUMBERS = itertools.count()  # every simulated sentence's key


def offline_rate(served, sentences: list[str]) -> tuple[float, list[str]]:
    """``attnkit translate``'s sentences/s on all of ``sentences`` as one input, warm (best of two), and
    each one's translation."""
    from attnkit.decode.translate import translate

    rates, outputs = [], []
    for _ in range(2):
        began = time.perf_counter()
        outputs = translate(served.model, served.tokenizer, sentences, served.config.decode)
        rates.append(len(sentences) / (time.perf_counter() - began))
    return max(rates), outputs


def closed_loop(served, engines: list, sentences: list[str], clients: int, seconds: float,
                expected: dict[str, str]) -> dict:  # fmt: skip
    """``clients`` sentences in flight at all times for ``seconds`` (after a warm-up of as many
    sentences), each worker thread stepping its engine; sentences/s, latencies and answers that differ
    from ``expected``."""
    settings = BeamSettings(served.config.decode.beam_size)
    lock, waiting = threading.Lock(), deque()
    latencies: list[float] = []
    counted = {"done": 0, "differ": 0}
    measuring = threading.Event()
    stop = threading.Event()

    def arrive() -> None:
        n = next(NUMBERS)  # (unique across levels: an engine's keys are never reused)
        waiting.append((n, sentences[n % len(sentences)], time.perf_counter()))

    for _ in range(clients):
        arrive()

    def work(engine) -> None:
        served.prepare_worker(len(engines))
        arrived: dict[int, tuple[str, float]] = {}
        while not stop.is_set() or arrived:  # once stopped, what runs is finished (and not counted)
            with lock:
                joining = [] if stop.is_set() else [waiting.popleft() for _ in range(len(waiting))]
            if not joining and not arrived:
                time.sleep(0.0002)
                continue
            for n, text, began in joining:
                arrived[n] = (text, began)
            done = engine.iterate([(n, text, settings) for n, text, _ in joining], set())
            now = time.perf_counter()
            with lock:
                for n, translations in done:
                    text, began = arrived.pop(n)
                    if measuring.is_set():
                        latencies.append(now - began)
                        counted["done"] += 1
                        counted["differ"] += translations[0][0] != expected[text]
                    if not stop.is_set():
                        arrive()

    threads = [threading.Thread(target=work, args=(engine,), daemon=True) for engine in engines]
    for thread in threads:
        thread.start()
    time.sleep(min(seconds / 3, 5))  # warm: every engine has run a few steps
    measuring.set()
    began = time.perf_counter()
    time.sleep(seconds)
    measuring.clear()
    took = time.perf_counter() - began
    stop.set()
    for thread in threads:
        thread.join()
    ordered = sorted(latencies) or [float("nan")]
    return {"rate": counted["done"] / took, "p50": statistics.median(ordered) * 1e3,
            "p99": ordered[int(0.99 * (len(ordered) - 1))] * 1e3, "differ": counted["differ"],
            "answers": counted["done"]}  # fmt: skip


def engines_as_served(served, workers: str) -> list:
    """The running batches ``attnkit serve`` would run ``served`` on: one per engine process (its model
    made again there from these weights), or ``served.streams`` in this process (``threads``)."""
    if workers == "processes":
        make = served.running_batch_process(deadline_s=600.0)
        if make is not None:
            engines = [make() for _ in range(served.engine_processes())]
            for engine in engines:
                engine.started()
            return engines
    return [served.running_batch() for _ in range(served.streams)]


def engine_only(ckpt: Path, sentences: list[str], levels: list[int], options: list[str], seconds: float,
                workers: str = "processes") -> dict:  # fmt: skip
    """The engine alone at each number of clients, and offline, as ``attnkit serve`` with ``options``
    (``decode.field=value``) would run the model: ``{"offline": sentences/s, clients: closed_loop's}``."""
    from attnkit.serve.translator import ServedTranslator

    served = ServedTranslator.load(ckpt, [o for o in options if o.startswith("decode.")])
    if served.steps_builder(print) is not None:  # decode.steps=auto: built now, as a server builds them
        served.build_compiled_steps()
    threads = torch.get_num_threads()
    rate, outputs = offline_rate(served, sentences)
    expected = dict(zip(sentences, outputs, strict=True))
    results: dict = {"offline": rate, "steps": served.steps(), "workers": workers}
    engines = engines_as_served(served, workers)
    try:
        for clients in levels:
            results[clients] = closed_loop(served, engines, sentences, clients, seconds, expected)
            torch.set_num_threads(threads)
    finally:
        for engine in engines:
            getattr(engine, "close", lambda: None)()
    results["engines"] = len(engines)
    return results


def print_results(results: dict, levels: list[int]) -> None:
    engines = f"{results['engines']} running batch(es) in {results['workers']}, {results['steps']} steps"
    print(f"offline (attnkit translate, in this process): {results['offline']:.1f} sentences/s; {engines}")
    print("| engine only (no HTTP) | clients | sentences/s | / offline | p50 ms | p99 ms | answers not the "
          "offline one |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for clients in levels:
        r = results[clients]
        share = r["rate"] / results["offline"]
        cells = ["attnkit running batches", clients, f"{r['rate']:.1f}", f"{share:.2f}", f"{r['p50']:.0f}",
                 f"{r['p99']:.0f}", f"{r['differ']} of {r['answers']}"]  # fmt: skip
        print("| " + " | ".join(map(str, cells)) + " |")


def read_sentences(data: Path | None, src: Path | None, lines: int) -> list[str]:
    source = src or data / "test_2016_flickr.de.gz"
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()][:lines]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", type=Path, required=True, help="a translation checkpoint or run directory")
    parser.add_argument("--data", type=Path, help="Multi30k's folder (test_2016_flickr.de.gz)")
    parser.add_argument("--src", type=Path, help="sentences, one per line (instead of --data)")
    parser.add_argument("--lines", type=int, default=1000, help="the first LINES sentences")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--workers", choices=["processes", "threads"], default="processes")
    parser.add_argument("overrides", nargs="*", help="decode.field=value, as attnkit serve takes them")
    args = parser.parse_args()
    sentences = read_sentences(args.data, args.src, args.lines)
    levels = [int(c) for c in args.clients.split(",")]
    options = [f"decode.beam_size={args.beam}", *args.overrides]
    print(f"{len(sentences)} sentences; beam {args.beam}; {torch.get_num_threads()} threads; "
          f"{args.seconds:g} s per level; {' '.join(args.overrides)}")  # fmt: skip
    print_results(engine_only(args.ckpt, sentences, levels, options, args.seconds, args.workers), levels)


if __name__ == "__main__":
    main()
