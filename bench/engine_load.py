"""The engine alone: attnkit's running batches (continuous batching) driven in this process by simulated
clients, with no HTTP, against ``attnkit translate`` of the same sentences offline.

A server's throughput is the engine's less what the HTTP layer costs (parsing, validation, tokenising,
JSON, the hops between the event loop and the workers' threads). This measures the engine alone: the
server's own continuous batcher and worker processes (serve/continuous.py, made as ``attnkit serve``
makes them with the same options; ``--workers threads`` for running batches on threads), called in
process by simulated clients, each sentence's tokens counted beforehand. Each of ``--clients`` clients
has one sentence in flight and sends the next as soon as the last is done (a closed loop, as
``bench/serve_load.py``'s clients). For each level it prints
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
import asyncio
import gzip
import statistics
import time
from pathlib import Path

import torch

from attnkit.decode.search import BeamSettings


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


async def closed_loop(batcher, work: dict[str, tuple[int, int]], settings: BeamSettings, sentences: list[str],
                      clients: int, seconds: float, expected: dict[str, str]) -> dict:  # fmt: skip
    """``clients`` loops of sentence after sentence through ``batcher`` for ``seconds`` (after a warm-up
    of a third of that); sentences/s, latencies and answers that differ from ``expected``. ``work``:
    each sentence's tokens and token positions, counted beforehand (the server counts them as the
    request comes: the HTTP layer's work)."""
    latencies: list[float] = []
    differ, turn = [0], [0]
    began = time.perf_counter()
    measured, deadline = began + min(seconds / 3, 5), began + min(seconds / 3, 5) + seconds

    async def client() -> None:
        while time.perf_counter() < deadline:
            text = sentences[turn[0] % len(sentences)]
            turn[0] += 1
            sent = time.perf_counter()
            ((best, _), *_), *_ = await batcher.submit([text], settings, *work[text])
            if sent >= measured:
                latencies.append(time.perf_counter() - sent)
                differ[0] += best != expected[text]

    await asyncio.gather(*(client() for _ in range(clients)))
    took = time.perf_counter() - measured
    ordered = sorted(latencies) or [float("nan")]
    return {"rate": len(latencies) / took, "p50": statistics.median(ordered) * 1e3,
            "p99": ordered[int(0.99 * (len(ordered) - 1))] * 1e3, "differ": differ[0],
            "answers": len(latencies)}  # fmt: skip


def engine_only(ckpt: Path, sentences: list[str], levels: list[int], options: list[str], seconds: float,
                workers: str = "processes", offline: tuple[float, list[str]] | None = None,
                ) -> dict:  # fmt: skip
    """The engine alone at each number of clients, and offline, as ``attnkit serve`` with ``options``
    (``decode.field=value``) would run the model: ``{"offline": sentences/s, clients: closed_loop's}``.
    ``offline``: the offline sentences/s and translations where the caller has measured them already
    (``bench/serve_load.py``), else measured here (:func:`offline_rate`)."""
    from attnkit.serve.state import ServerState, ServeSettings
    from attnkit.serve.translator import ServedTranslator

    served = ServedTranslator.load(ckpt, [o for o in options if o.startswith("decode.")])
    if served.steps_builder(print) is not None:  # decode.steps=auto: built now, as a server builds them
        served.build_compiled_steps()
    rate, outputs = offline or offline_rate(served, sentences)
    expected = dict(zip(sentences, outputs, strict=True))
    settings = BeamSettings(served.config.decode.beam_size)
    work = {text: (tokens, served.positions([tokens], settings))
            for text, tokens in zip(sentences, served.tokens(sentences), strict=True)}  # fmt: skip
    # the server's own batcher and engines (serve/state.py), as attnkit serve makes them
    batcher = ServerState(ServeSettings(batching="continuous", workers=workers)).batcher_for(served)
    batcher.started()

    async def levels_in_turn() -> dict:
        batcher.start()
        try:
            return {
                c: await closed_loop(batcher, work, settings, sentences, c, seconds, expected) for c in levels
            }
        finally:
            await batcher.stop()

    results = asyncio.run(levels_in_turn())
    return {
        "offline": rate,
        "steps": served.steps(),
        "workers": workers,
        "batches": batcher.workers,
        **results,
    }


def print_results(results: dict, levels: list[int]) -> None:
    running = f"{results['batches']} running batch(es) in {results['workers']}, {results['steps']} steps"
    print(f"offline (attnkit translate, in this process): {results['offline']:.1f} sentences/s; {running}")
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
