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

``--breakdown`` says where the time goes instead, on one thread each: ``attnkit translate`` offline
against one running batch (on a thread of this process, as ``--workers threads`` runs it) at each
level, in milliseconds per sentence: encoding the newcomers (``ready_sources``: the encoder, and with
compiled steps the start token's step too; with the sources per call), the decoder's steps (with the
rows per call, and the keys each row's attention reads on average: the positions decoded so far,
padding included, and its batch's padded source width), the rest of the search (ranking,
reordering, merging, tokenising), and, for the running batch, the time between its iterations (the
hops to the event loop and the clients). Offline encodes a batch of sources of like lengths at once
and steps hundreds of rows; a running batch encodes the few that came since its last step and steps
its clients' rows, each row reading as many positions as the oldest row running has decoded and as
many source keys as the longest source running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from attnkit.cpu.allocator import restart_on_allocator, running
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
            ((best, *_), *_), *_ = await batcher.submit([text], settings, *work[text])
            if sent >= measured:
                latencies.append(time.perf_counter() - sent)
                differ[0] += best != expected[text]

    await asyncio.gather(*(client() for _ in range(clients)))
    took = time.perf_counter() - measured
    ordered = sorted(latencies) or [float("nan")]
    return {"rate": len(latencies) / took, "p50": statistics.median(ordered) * 1e3,
            "p99": ordered[int(0.99 * (len(ordered) - 1))] * 1e3, "differ": differ[0],
            "answers": len(latencies)}  # fmt: skip


def served_as_server(ckpt: Path, options: list[str]):
    """The checkpoint loaded as ``attnkit serve`` loads it with the decode settings among ``options``
    (``decode.field=value``), its compiled steps built now where ``decode.steps=auto`` would build them
    beside a server."""
    from attnkit.serve.translator import ServedTranslator

    served = ServedTranslator.load(ckpt, [o for o in options if o.startswith("decode.")])
    if served.steps_builder(print) is not None:
        served.build_compiled_steps()
    return served


def counted_work(served, sentences: list[str], settings: BeamSettings) -> dict[str, tuple[int, int]]:
    """Each sentence's tokens and token positions, counted beforehand (the server counts them as the
    request comes: the HTTP layer's work)."""
    return {text: (tokens, served.positions([tokens], settings))
            for text, tokens in zip(sentences, served.tokens(sentences), strict=True)}  # fmt: skip


async def levels_in_turn(batcher, levels: list[int], work: dict[str, tuple[int, int]], settings: BeamSettings,
                         sentences: list[str], seconds: float, expected: dict[str, str]) -> dict:  # fmt: skip
    """:func:`closed_loop`'s results through ``batcher`` (started now, stopped after) at each number of
    clients in ``levels``, one after the other."""
    batcher.start()
    try:
        return {
            c: await closed_loop(batcher, work, settings, sentences, c, seconds, expected) for c in levels
        }
    finally:
        await batcher.stop()


def engine_only(ckpt: Path, sentences: list[str], levels: list[int], options: list[str], seconds: float,
                workers: str = "processes", offline: tuple[float, list[str]] | None = None,
                allocator: str = "auto") -> dict:  # fmt: skip
    """The engine alone at each number of clients, and offline, as ``attnkit serve`` with ``options``
    (``decode.field=value``) and ``--allocator`` would run the model: ``{"offline": sentences/s,
    clients: closed_loop's}``. ``offline``: the offline sentences/s and translations where the caller
    has measured them already (``bench/serve_load.py``), else measured here (:func:`offline_rate`)."""
    from attnkit.cpu.allocator import choose
    from attnkit.serve.state import ServerState, ServeSettings

    served = served_as_server(ckpt, options)
    rate, outputs = offline or offline_rate(served, sentences)
    expected = dict(zip(sentences, outputs, strict=True))
    settings = BeamSettings(served.config.decode.beam_size)
    work = counted_work(served, sentences, settings)
    # the server's own batcher and engines (serve/state.py), as attnkit serve makes them
    library, said = choose(allocator) if workers == "processes" else (None, "")
    settings_of_server = ServeSettings(batching="continuous", workers=workers, allocator=library)
    batcher = ServerState(settings_of_server).batcher_for(served)
    batcher.started()
    results = asyncio.run(levels_in_turn(batcher, levels, work, settings, sentences, seconds, expected))
    return {
        "offline": rate,
        "steps": served.steps(),
        "workers": workers,
        "batches": batcher.workers,
        "allocator": said,
        **results,
    }


@contextlib.contextmanager
def timed_parts() -> Iterator[dict[str, list[float]]]:
    """While open, each part of the searches in this process as ``[seconds, calls, items, ...]``:
    ``encoding`` (``ready_sources``; items: sources), ``steps`` (the decoder's ``next_logits``, or beam
    search's compiled step with its ranking, ``ranked``; items: rows, then the keys its rows' attention
    reads, summed over the rows: the positions decoded so far, padding included, and the source's) and
    ``iterations`` (``RunningTranslations.iterate``); a call inside another of its part (an eager step
    under a compiled decoding's) counts once, and a compiled decoding's first ``next_logits`` not at
    all (it hands over the logits that the compiled first step computed while encoding)."""
    import attnkit.decode.continuous as continuous
    import attnkit.decode.translate as translating
    from attnkit.decode.compiled import CompiledDecoding
    from attnkit.models.decoding import Seq2SeqDecoding

    parts: dict[str, list[float]] = {part: [0.0, 0, 0] for part in ("encoding", "iterations")}
    parts["steps"] = [0.0, 0, 0, 0, 0]
    depth = dict.fromkeys(parts, 0)
    patched = []

    def timing(owner: object, name: str, part: str, items, counted=lambda args: True, more=None) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            if not counted(args):
                return original(*args, **kwargs)
            depth[part] += 1
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                depth[part] -= 1
                if not depth[part]:
                    parts[part][0] += time.perf_counter() - began
                    parts[part][1] += 1
                    parts[part][2] += items(args)
                    for i, value in enumerate(more(args) if more else ()):
                        parts[part][3 + i] += value

        patched.append((owner, name, original))
        setattr(owner, name, timed)

    timing(continuous, "ready_sources", "encoding", lambda args: len(args[1]))
    timing(translating, "ready_sources", "encoding", lambda args: len(args[1]))
    # (decoding, tokens (R, t)): each row reads t positions (its own, and the padding before them) and
    # the padded width S of its batch's sources (src_mask: (R, 1, S))
    keys = lambda args: (args[1].numel(), args[1].size(0) * args[0].src_mask.size(-1))  # noqa: E731
    timing(Seq2SeqDecoding, "next_logits", "steps", lambda args: args[1].size(0), more=keys)
    computes = lambda args: args[0].first_logits is None  # noqa: E731 (not the first step's, handed over)
    timing(CompiledDecoding, "next_logits", "steps", lambda args: args[1].size(0), computes, keys)
    # beam search's compiled step ranks too (CompiledDecoding.ranked: the step and its ranking)
    ranks = lambda args: computes(args) and args[0].step_beams > 1  # noqa: E731
    timing(CompiledDecoding, "ranked", "steps", lambda args: args[1].size(0), ranks, keys)
    timing(continuous.RunningTranslations, "iterate", "iterations", lambda args: 0)
    try:
        yield parts
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def per_sentence(parts: dict[str, list[float]], wall: float) -> dict[str, float]:
    """A breakdown's row: each part's milliseconds per sentence (the sources encoded), the items per call
    and sentences/s."""
    sentences = parts["encoding"][2]
    encoding, steps = parts["encoding"][0], parts["steps"][0]
    searching = parts["iterations"][0] or wall  # offline: all of translate is the search
    return {"sentences": sentences, "rate": sentences / wall,
            "encoding": 1e3 * encoding / sentences, "sources per call": sentences / parts["encoding"][1],
            "steps": 1e3 * steps / sentences, "rows per call": parts["steps"][2] / parts["steps"][1],
            "self keys": parts["steps"][3] / parts["steps"][2],
            "cross keys": parts["steps"][4] / parts["steps"][2],
            "rest": 1e3 * (searching - encoding - steps) / sentences,
            "between": 1e3 * (wall - searching) / sentences, "all": 1e3 * wall / sentences}  # fmt: skip


def breakdown(
    ckpt: Path, sentences: list[str], levels: list[int], options: list[str], seconds: float
) -> dict:
    """Where the time goes, on one thread (see the module docstring): ``{"offline": per_sentence's row,
    clients: the running batch's row at that level}``."""
    from attnkit.decode.translate import translate
    from attnkit.serve.state import ServerState, ServeSettings

    torch.set_num_threads(1)
    served = served_as_server(ckpt, [*options, "decode.streams=1"])  # one running batch, one thread
    decode = served.config.decode
    outputs = translate(served.model, served.tokenizer, sentences, decode)  # warm
    with timed_parts() as parts:
        began = time.perf_counter()
        translate(served.model, served.tokenizer, sentences, decode)
        rows = {"offline": per_sentence(parts, time.perf_counter() - began), "steps": served.steps()}
    expected = dict(zip(sentences, outputs, strict=True))
    settings = BeamSettings(decode.beam_size)
    work = counted_work(served, sentences, settings)
    for clients in levels:  # a running batch of its own at each level, timed alone
        batcher = ServerState(ServeSettings(batching="continuous", workers="threads")).batcher_for(served)
        with timed_parts() as parts:
            began = time.perf_counter()
            level = levels_in_turn(batcher, [clients], work, settings, sentences, seconds, expected)
            answered = asyncio.run(level)[clients]
            rows[clients] = {**per_sentence(parts, time.perf_counter() - began), "differ": answered["differ"]}
    return rows


def print_breakdown(rows: dict, levels: list[int]) -> None:
    print(f"one thread, {rows['steps']} steps; milliseconds per sentence (sources or rows per call)")
    print("| search | sentences/s | encoding newcomers | decoder steps | keys a row reads (self, cross) | "
          "the rest of the search | between iterations | in all | answers not the offline one |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for name in ["offline", *levels]:
        r = rows[name]
        label = "attnkit translate (offline)" if name == "offline" else f"running batch, {name} clients"
        between = "" if name == "offline" else f"{r['between']:.2f}"
        differ = "" if name == "offline" else str(r["differ"])
        cells = [label, f"{r['rate']:.1f}", f"{r['encoding']:.2f} ({r['sources per call']:.1f} sources)",
                 f"{r['steps']:.2f} ({r['rows per call']:.0f} rows)",
                 f"{r['self keys']:.1f}, {r['cross keys']:.1f}", f"{r['rest']:.2f}", between,
                 f"{r['all']:.2f}", differ]  # fmt: skip
        print("| " + " | ".join(cells) + " |")


def print_results(results: dict, levels: list[int]) -> None:
    running = f"{results['batches']} running batch(es) in {results['workers']}, {results['steps']} steps"
    running += f" ({results['allocator']})" if results["allocator"] else ""
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
    parser.add_argument("--allocator", default="auto", help="the worker processes', as attnkit serve's")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="where the time goes, one thread: offline against one running batch per level",
    )
    parser.add_argument(
        "--by-length",
        action="store_true",
        help="the clients send the sentences shortest first (a running batch's rows then decode outputs "
        "of like lengths, as offline's batches do): what padding to the widest running row costs",
    )
    parser.add_argument("overrides", nargs="*", help="decode.field=value, as attnkit serve takes them")
    args = parser.parse_args()
    sentences = read_sentences(args.data, args.src, args.lines)
    if args.by_length:
        sentences.sort(key=len)
    levels = [int(c) for c in args.clients.split(",")]
    options = [f"decode.beam_size={args.beam}", *args.overrides]
    order = ", shortest first" if args.by_length else ""
    print(f"{len(sentences)} sentences{order}; beam {args.beam}; {torch.get_num_threads()} threads; "
          f"allocator {running()}; {args.seconds:g} s per level; {' '.join(args.overrides)}")  # fmt: skip
    if args.breakdown:
        print_breakdown(breakdown(args.ckpt, sentences, levels, options, args.seconds), levels)
        return
    results = engine_only(
        args.ckpt, sentences, levels, options, args.seconds, args.workers, allocator=args.allocator
    )
    print_results(results, levels)


if __name__ == "__main__":
    restart_on_allocator()  # on the allocator the attnkit command runs on (tcmalloc where found)
    main()
