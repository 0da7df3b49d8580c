"""Load on ``attnkit serve``: requests/s, target tokens/s and latency at 1, 8 and 32 concurrent clients,
against the common way to serve CTranslate2 in the same run.

Each client sends one sentence per request (``POST /translator/translate``), the next as soon as the
last is answered, for ``--seconds`` at each level; the sentences are the test set's (Multi30k
test_2016_flickr by default), in turn. The peer is a plain FastAPI app whose endpoint calls CTranslate2's
``translate_batch`` for its one request, in FastAPI's thread pool (``def`` endpoint), on the same
weights exported by ``attnkit export --to ctranslate2``, with the same beam and the same threads
(CTranslate2's ``inter_threads`` = torch's threads in attnkit's server, one intra-op thread each: as
many translations side by side as attnkit's server runs workers, each on one thread; CTranslate2 on
two intra-op threads answered one request alone 5× slower than on one on a two-core machine),
tokenised by the same tokenizer. Target tokens are counted with the checkpoint's tokenizer for both.

``--engines attnkit,ctranslate2`` measures attnkit serve with each engine in turn (CTranslate2 on the
exported weights, behind the same batcher). ``--soak N`` then sends N requests to the first from 8
clients, a fifth of them hostile (bench/soak.py: malformed bodies, bodies over the 1 MiB limit, /explore
over its token limit and within it, random paths, clients that give up before their answer), and
checks: no 5xx but 503, every status the one its kind expects, every well-formed request answered with
the output the server gave that sentence alone, a request after the soak answered at once, and the
server's RSS after the last request against its RSS after the first 1,000. ``--soak-captioner RUN``
and ``--soak-recogniser RUN`` soak a captioner's and a speech recogniser's servers at the same time,
beside the translator's, with uploads (decompression bombs, other image formats, WAV files at absurd
rates, cut mid-sample or too short, sound over the budget, forms that cannot be read);
``--soak-decoder RUN`` soaks a decoder (``POST /generate``) afterwards, whose leaving clients drop
streams after their first piece.

Run: ``python bench/serve_load.py --ckpt runs/de_en --data data/multi30k`` (a translation checkpoint;
``--src FILE`` for other sentences).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gzip
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from keep_alive import KeepAlive
from soak import CaptionerDialect, Dialect, GeneratorDialect, RecogniserDialect, soak

from attnkit.checkpoint.folder import resolve_checkpoint
from attnkit.cpu.allocator import restart_on_allocator, running
from attnkit.data.tokenizer import Tokenizer


def cpu_seconds(server: int) -> dict[str, float]:
    """The CPU seconds (user and system) used so far by the server's process, by its children (the
    worker processes) and by this process (the load generator), and the time now (Linux: /proc)."""
    tick = os.sysconf("SC_CLK_TCK")

    def used(stat: Path) -> tuple[int, float]:
        fields = stat.read_text(encoding="utf-8").rsplit(")", 1)[1].split()
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / tick  # parent, utime + stime

    server_s, workers_s = 0.0, 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent, seconds = used(stat)
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
        if int(stat.parent.name) == server:
            server_s = seconds
        elif parent == server:
            workers_s += seconds  # (an ended child's time is the server's, once reaped)
    return {
        "server": server_s,
        "workers": workers_s,
        "client": time.process_time(),
        "at": time.perf_counter(),
    }


def cores_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """How many cores each of server, worker processes and client kept busy between two
    :func:`cpu_seconds`."""
    wall = after["at"] - before["at"]
    return {part: (after[part] - before[part]) / wall for part in ("server", "workers", "client")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command: list[str], url: str) -> subprocess.Popen:
    """A server process, once its /health answers 200 and its steps are not being compiled (a server
    with ``decode.steps=auto`` answers with the model's own steps meanwhile: not what it serves with)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600  # a fresh cache: several steps to build, ~20-60 s each
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server stopped ({process.returncode}): {' '.join(command)}")
        try:
            health = httpx.get(f"{url}/health", timeout=2)
            if health.status_code == 200 and health.json().get("steps") != "compiling":
                if "steps" in health.json():
                    print(f"attnkit serve ready, its steps {health.json()['steps']}")
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"the server was not ready in 600 s: {' '.join(command)}")


def offline(ckpt: Path, sentences: list[str], beam: int, options: list[str]) -> dict:
    """What the model does without a server, in this process, warm, with the server's decoding settings
    (``decode.field=value`` of ``options``): ``attnkit translate``'s sentences/s on all the sentences as
    one input, the median time of a batch of 8 (8 clients' requests, were they one batch) and of one
    sentence alone (one client's request, with no server), and each sentence's translation (what the
    server's answers are checked against)."""
    from attnkit.cpu.compiled.build import FIRST_STEP
    from attnkit.cpu.compiled.steps import all_built
    from attnkit.decode.translate import Reporting, translate
    from attnkit.loading import load_for_inference
    from attnkit.models import archs

    overrides = [f"decode.beam_size={beam}", *(o for o in options if o.startswith("decode."))]
    model, tokenizer, config = load_for_inference(
        resolve_checkpoint(ckpt), "cpu", arch=archs(using="translate"), overrides=overrides
    )
    # warm; with decode.steps=auto, the compiled steps built (as the server builds them in the
    # background, which start() waits for): both then take them from the cache
    warm = (
        dataclasses.replace(config.decode, steps="compiled")
        if config.decode.steps == "auto"
        else config.decode
    )
    translate(model, tokenizer, sentences[:64], warm, reporting=Reporting(warn=print))  # (says why not)
    began = time.perf_counter()
    outputs = translate(model, tokenizer, sentences, config.decode)
    rate = len(sentences) / (time.perf_counter() - began)
    eights = []
    for start in range(0, min(len(sentences), 8 * 24), 8):
        began = time.perf_counter()
        translate(model, tokenizer, sentences[start : start + 8], config.decode)
        eights.append(time.perf_counter() - began)
    ones = []
    for sentence in sentences[:100]:
        began = time.perf_counter()
        translate(model, tokenizer, [sentence], config.decode)
        ones.append(time.perf_counter() - began)
    compiled = config.decode.steps != "eager" and all_built(model, [FIRST_STEP, beam])
    return {"rate": rate, "batch_of_8_ms": statistics.median(eights) * 1e3,
            "one_alone_ms": statistics.median(ones) * 1e3,
            "outputs": dict(zip(sentences, outputs, strict=True)),
            "steps": "compiled" if compiled else "eager"}  # fmt: skip


async def load(
    url: str,
    body,
    answer,
    clients: int,
    seconds: float,
    sentences: list[str],
    count,
    expected=None,
    lean: bool = True,
) -> dict:
    """``clients`` loops of request after request for ``seconds``; requests/s, tokens/s, latencies, and
    with ``expected`` (each sentence's offline translation) how many answers differ from it. Each client
    has a keep-alive connection of its own (``lean``: bench/keep_alive.py; else httpx's pool)."""
    latencies, tokens, errors, turn, differ = [], [0], [0], [0], [0]
    deadline = time.perf_counter() + seconds

    async def client(post) -> None:
        while time.perf_counter() < deadline:
            sentence = sentences[turn[0] % len(sentences)]
            turn[0] += 1
            began = time.perf_counter()
            status, answered = await post(body(sentence))
            if status != 200:
                errors[0] += 1
                continue
            latencies.append(time.perf_counter() - began)
            tokens[0] += count(answer(answered))
            if expected is not None:
                differ[0] += answer(answered) != expected[sentence]

    began = time.perf_counter()
    if lean:
        connections = [KeepAlive(url) for _ in range(clients)]
        await asyncio.gather(*(client(connection.post) for connection in connections))
        for connection in connections:
            await connection.close()
    else:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=clients)) as http:

            async def post(payload):
                response = await http.post(url, json=payload)
                return response.status_code, response.json() if response.status_code == 200 else None

            await asyncio.gather(*(client(post) for _ in range(clients)))
    elapsed = time.perf_counter() - began
    ordered = sorted(latencies) or [float("nan")]
    p50, p99 = statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))]
    return {"rps": len(latencies) / elapsed, "tps": tokens[0] / elapsed, "errors": errors[0],
            "p50": p50 * 1e3, "p99": p99 * 1e3, "differ": differ[0] if expected is not None else "",
            "answers": len(latencies)}  # fmt: skip


async def poisson(url: str, body, rate: float, seconds: float, sentences: list[str], seed: int = 0) -> dict:
    """Requests arriving at ``rate`` per second in a Poisson process (exponential gaps, seeded) for
    ``seconds``, each sent at its time whatever is still unanswered (an open loop: MLPerf's server
    scenario); each latency runs from its arrival to its answer, so a late send counts against it. Each
    request takes an idle keep-alive connection (bench/keep_alive.py), or opens one."""
    gaps, latencies, errors = random.Random(seed), [], [0]
    idle: list[KeepAlive] = []  # connections with no request in flight
    # at most 512 connections (a request past them waits for one, its wait counted in its latency)
    connections = asyncio.Semaphore(512)

    async def one(sentence: str, arrival: float) -> None:
        async with connections:
            connection = idle.pop() if idle else KeepAlive(url)
            try:
                status, _ = await connection.post(body(sentence))
            except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.TimeoutError):  # refused
                # or dropped by a server past its capacity
                errors[0] += 1
                await connection.close()
                return
            idle.append(connection)
        if status != 200:
            errors[0] += 1
        else:
            latencies.append(time.perf_counter() - arrival)

    sent, start, at = [], time.perf_counter(), 0.0
    while at < seconds:
        wait = start + at - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        sent.append(asyncio.create_task(one(sentences[len(sent) % len(sentences)], start + at)))
        at += gaps.expovariate(rate)
    await asyncio.gather(*sent)
    for connection in idle:
        await connection.close()
    ordered = sorted(latencies) or [float("nan")]
    return {"rate": rate, "sent": len(sent), "errors": errors[0], "p50": statistics.median(ordered) * 1e3,
            "p99": ordered[int(0.99 * (len(ordered) - 1))] * 1e3}  # fmt: skip


def server_scenario(
    url: str, body, offline: float, bound_ms: float, seconds: float, sentences: list[str]
) -> list:
    """Poisson arrivals at rising shares of the offline throughput (0.1 to 1.0 of it) until p99 passes
    ``bound_ms`` or a request fails: each rate's result with its share, the last one over the bound."""
    results = []
    for share in [x / 10 for x in range(1, 11)]:
        result = asyncio.run(poisson(url, body, share * offline, seconds, sentences, seed=len(results)))
        results.append({**result, "share": share})
        if result["p99"] > bound_ms or result["errors"]:
            break
    return results


def print_scenarios(scenarios: dict[str, list], offline: float, bound_ms: float) -> None:
    """Each server's Poisson rates and their latencies, and the highest rate within the bound."""
    print(f"| server scenario (Poisson arrivals) | requests/s | / offline | sent | p50 ms | p99 ms | "
          f"p99 <= {bound_ms:g} ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, runs in scenarios.items():
        for r in runs:
            within = r["p99"] <= bound_ms and not r["errors"]
            cells = [SHOWN[name], f"{r['rate']:.1f}", f"{r['share']:.1f}", r["sent"], f"{r['p50']:.0f}",
                     f"{r['p99']:.0f}", "yes" if within else f"no ({r['errors']} errors)"]  # fmt: skip
            print("| " + " | ".join(map(str, cells)) + " |")
    for name, runs in scenarios.items():
        passed = [r for r in runs if r["p99"] <= bound_ms and not r["errors"]]
        best = (
            f"{passed[-1]['rate']:.1f} requests/s, {passed[-1]['share']:.1f}x offline" if passed else "none"
        )
        print(f"{SHOWN[name]}: the highest Poisson rate with p99 <= {bound_ms:g} ms: {best}")


def run_peer(folder: str, port: int, beam: int, threads: int) -> None:
    """The peer: FastAPI + CTranslate2 ``translate_batch`` per request in the thread pool."""
    import ctranslate2
    import uvicorn
    from fastapi import FastAPI

    tokenizer = Tokenizer.load(Path(folder) / "tokenizer.json")
    translator = ctranslate2.Translator(folder, device="cpu", inter_threads=threads, intra_threads=1)
    eos = tokenizer.hf.id_to_token(tokenizer.specials.eos)
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"status": "ready"}

    @app.post("/translate")
    def translate(request: dict) -> dict:  # def: FastAPI runs it in its thread pool
        tokens = [*tokenizer.hf.encode(request["src"], add_special_tokens=False).tokens, eos]
        (result,) = translator.translate_batch([tokens], beam_size=beam, max_decoding_length=256)
        ids = [tokenizer.hf.token_to_id(t) for t in result.hypotheses[0] if t != eos]
        return {"tgt": tokenizer.decode(ids)}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


SHOWN = {"attnkit": "attnkit serve", "ctranslate2": "attnkit serve --engine ctranslate2",
         "peer": "FastAPI + CTranslate2 translate_batch"}  # fmt: skip


def soaks(args: argparse.Namespace, url: str, pid: int, sentences: list[str]) -> dict[str, dict]:
    """The soak of the translation server at ``url``, and at the same time those of a captioner's and a
    speech recogniser's servers (``--soak-captioner``, ``--soak-recogniser``; each started here, in a
    process of its own, in the precision ``--server-option decode.precision=...`` names): their results
    by name."""
    runs = {"translator": (url, pid, sentences, Dialect())}
    servers = []
    precision = [option for option in args.server_option if option.startswith("decode.precision=")]
    try:
        for name, ckpt, dialect in (("captioner", args.soak_captioner, CaptionerDialect),
                                    ("recogniser", args.soak_recogniser, RecogniserDialect)):  # fmt: skip
            if ckpt is not None:
                port = free_port()
                command = [sys.executable, "-m", "attnkit", "serve", "--ckpt", str(ckpt), "--port", str(port),
                           *precision]  # fmt: skip
                servers.append(start(command, f"http://127.0.0.1:{port}"))
                speaks = dialect.of()
                runs[name] = (f"http://127.0.0.1:{port}", servers[-1].pid, speaks.items, speaks)

        async def together() -> list[dict]:
            return await asyncio.gather(
                *(soak(u, args.soak, items, p, d) for u, p, items, d in runs.values())
            )

        return dict(zip(runs, asyncio.run(together()), strict=True))
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=60)


def main() -> None:
    if sys.argv[1:2] == ["--peer-server"]:
        return run_peer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", type=Path, required=True, help="a translation checkpoint or run directory")
    parser.add_argument("--data", type=Path, help="Multi30k's folder (test_2016_flickr.de.gz)")
    parser.add_argument("--src", type=Path, help="sentences, one per line (instead of --data)")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch / CTranslate2 threads"
    )
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--client", choices=["lean", "httpx"], default="lean",
                        help="the closed-loop clients' HTTP: a keep-alive connection each, written and read "
                        "by hand (bench/keep_alive.py: little CPU beside the server, as the Poisson "
                        "scenario's), or httpx's AsyncClient (about 2 ms of CPU a request)")  # fmt: skip
    parser.add_argument("--engines", default="attnkit",
                        help="attnkit serve's engines to measure, in turn: attnkit, ctranslate2 (the "
                        "exported weights) or both, comma-separated; the soak runs on the first")  # fmt: skip
    parser.add_argument("--server-option", action="append", default=[],
                        help="an option or decode.field=value for attnkit serve (repeatable)")  # fmt: skip
    parser.add_argument("--scenario-seconds", type=float, default=10,
                        help="the server scenario's seconds at each rate (0: none)")  # fmt: skip
    parser.add_argument("--p99-bound-ms", type=float, default=1000,
                        help="the server scenario's bound on p99 latency")  # fmt: skip
    parser.add_argument("--engine-only", action="store_true",
                        help="also attnkit's running batches driven in process with no HTTP "
                        "(bench/engine_load.py), at the same levels")  # fmt: skip
    parser.add_argument("--soak", type=int, default=0, help="requests of the soak test (0: none)")
    parser.add_argument("--soak-decoder", type=Path,
                        help="a decoder (GPT) checkpoint: the soak runs against it too, its clients leaving "
                        "streams (/generate_stream) early")  # fmt: skip
    parser.add_argument("--soak-captioner", type=Path,
                        help="a captioner's checkpoint: its server is soaked beside the translator's, "
                        "with image uploads (decompression bombs, other formats, cut files)")  # fmt: skip
    parser.add_argument("--soak-recogniser", type=Path,
                        help="a speech recogniser's checkpoint: its server is soaked beside the "
                        "translator's, with WAV uploads (absurd rates, samples cut mid-way, clips too "
                        "short, sound over the budget)")  # fmt: skip
    args = parser.parse_args()
    source = args.src or args.data / "test_2016_flickr.de.gz"
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    tokenizer = Tokenizer.load(resolve_checkpoint(args.ckpt) / "tokenizer.json")

    def count(text: str) -> int:
        return len(tokenizer.encode(text)) if text else 0

    levels = [int(c) for c in args.clients.split(",")]
    engines = args.engines.split(",")
    print(f"{len(sentences)} sentences from {source}; beam {args.beam}; {args.threads} threads; "
          f"allocator {running()}; {args.seconds:g} s per level; {args.client} clients; attnkit serve "
          f"{' '.join(args.server_option)}")  # fmt: skip
    results: dict[tuple[str, int], dict] = {}
    alone = offline(args.ckpt, sentences, args.beam, args.server_option) if "attnkit" in engines else None
    if alone is not None:
        print(f"offline (attnkit translate, the same sentences and decode settings, in this process): "
              f"{alone['rate']:.1f} sentences/s; a batch of 8: {alone['batch_of_8_ms']:.0f} ms; one sentence "
              f"alone: {alone['one_alone_ms']:.1f} ms; its steps "
              f"{alone['steps']}")  # fmt: skip
    engine_alone = None
    if args.engine_only and alone is not None:
        from engine_load import engine_only, print_results

        options = [f"decode.beam_size={args.beam}", *args.server_option]
        measured = (alone["rate"], [alone["outputs"][text] for text in sentences])  # (not measured again)
        # the worker processes' allocator as the server's (--allocator=NAME among the server's options)
        allocator = next(
            (o.partition("=")[2] for o in args.server_option if o.startswith("--allocator=")), "auto"
        )
        engine_alone = engine_only(args.ckpt, sentences, levels, options, args.seconds, offline=measured,
                                   allocator=allocator)  # fmt: skip
    scenarios: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as work:
        exported = Path(work) / "ct2"
        if not args.no_peer or "ctranslate2" in engines:
            export = ["export", "--ckpt", str(args.ckpt), "--to", "ctranslate2", "--out", str(exported)]
            subprocess.run([sys.executable, "-m", "attnkit", *export], check=True, capture_output=True)
        for engine in engines:
            folder = exported if engine == "ctranslate2" else args.ckpt
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            command = ["serve", "--ckpt", str(folder), "--port", str(port), "--engine", engine,
                       f"decode.beam_size={args.beam}", *args.server_option]  # fmt: skip
            server = start([sys.executable, "-m", "attnkit", *command], url)
            try:
                for clients in levels:
                    expected = alone["outputs"] if alone is not None and engine == "attnkit" else None
                    before = cpu_seconds(server.pid)
                    results[(engine, clients)] = asyncio.run(load(
                        f"{url}/translator/translate", lambda s: [{"src": s}], lambda r: r[0][0]["tgt"],
                        clients, args.seconds, sentences, count, expected,
                        lean=args.client == "lean"))  # fmt: skip
                    results[(engine, clients)]["cores"] = cores_used(before, cpu_seconds(server.pid))
                if args.scenario_seconds and alone is not None:
                    scenarios[engine] = server_scenario(
                        f"{url}/translator/translate", lambda s: [{"src": s}], alone["rate"],
                        args.p99_bound_ms, args.scenario_seconds, sentences)  # fmt: skip
                if args.soak and engine == engines[0]:
                    soaked = soaks(args, url, server.pid, sentences)
            finally:
                server.terminate()
                server.wait(timeout=60)
        if not args.no_peer:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            peer = start([sys.executable, __file__, "--peer-server", str(exported), str(port),
                          str(args.beam), str(args.threads)], url)  # fmt: skip
            try:
                for clients in levels:
                    results[("peer", clients)] = asyncio.run(load(
                        f"{url}/translate", lambda s: {"src": s}, lambda r: r["tgt"], clients,
                        args.seconds, sentences, count, lean=args.client == "lean"))  # fmt: skip
                if args.scenario_seconds and alone is not None:
                    scenarios["peer"] = server_scenario(
                        f"{url}/translate", lambda s: {"src": s}, alone["rate"], args.p99_bound_ms,
                        args.scenario_seconds, sentences)  # fmt: skip
            finally:
                peer.terminate()
                peer.wait(timeout=60)
    print(
        "| server | clients | requests/s | / offline | target tokens/s | p50 ms | p99 ms | p99 / p50 | "
        "errors | answers not the offline one |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (name, clients), r in results.items():
        share = f"{r['rps'] / alone['rate']:.2f}" if alone is not None else ""
        differ = f"{r['differ']} of {r['answers']}" if r["differ"] != "" else ""
        cells = [SHOWN[name], clients, f"{r['rps']:.1f}", share, f"{r['tps']:.0f}", f"{r['p50']:.0f}",
                 f"{r['p99']:.0f}", f"{r['p99'] / r['p50']:.1f}", r["errors"], differ]  # fmt: skip
        print("| " + " | ".join(map(str, cells)) + " |")
    for (name, clients), r in results.items():
        if "cores" in r and sys.platform == "linux":
            c = r["cores"]
            print(f"{SHOWN[name]} at {clients} clients, cores used: server {c['server']:.2f}, "
                  f"worker processes {c['workers']:.2f}, load generator {c['client']:.2f}")  # fmt: skip
    most, one = max(levels), min(levels)
    middle = [c for c in levels if one < c < most]
    for engine in engines:
        ours, one_client = results[(engine, most)]["rps"], results[(engine, one)]["rps"]
        print(f"{SHOWN[engine]}: at {most} clients / at {one}: {ours / one_client:.2f}x requests/s")
        if alone is not None and one == 1 and engine == "attnkit":
            single = results[(engine, 1)]["p50"] / alone["one_alone_ms"]
            print(f"{SHOWN[engine]}: p50 at 1 client / attnkit translate of one sentence alone "
                  f"({alone['one_alone_ms']:.1f} ms, median): {single:.2f}")  # fmt: skip
        if ("peer", most) in results:
            peer = results[("peer", most)]["rps"]
            print(f"{SHOWN[engine]} / peer at {most} clients: {ours / peer:.2f}x requests/s")
        if middle:
            ratio = results[(engine, middle[0])]["p99"] / results[(engine, one)]["p50"]
            print(f"{SHOWN[engine]}: p99 at {middle[0]} clients / p50 at {one}: {ratio:.2f}")
            if alone is not None and middle[0] == 8:
                eight = results[(engine, 8)]["p50"] / alone["batch_of_8_ms"]
                print(f"{SHOWN[engine]}: p50 at 8 clients / a batch of 8 offline: {eight:.2f}")
    if engine_alone is not None:
        print_results(engine_alone, levels)
        for clients in levels:
            served, alone_rate = results[("attnkit", clients)]["rps"], engine_alone[clients]["rate"]
            print(f"at {clients} clients: attnkit serve / its engine alone {served / alone_rate:.2f}x "
                  "(what the HTTP layer leaves)")  # fmt: skip
    if scenarios:
        print_scenarios(scenarios, alone["rate"], args.p99_bound_ms)
    if args.soak:
        print("soak: " + json.dumps(soaked.pop("translator")))
        for name, result in soaked.items():
            print(f"soak ({name}, beside the translator's): " + json.dumps(result))
    if args.soak and args.soak_decoder:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = start([sys.executable, "-m", "attnkit", "serve", "--ckpt", str(args.soak_decoder), "--port",
                        str(port)], url)  # fmt: skip
        try:
            decoder = asyncio.run(soak(url, args.soak, sentences, server.pid, GeneratorDialect()))
        finally:
            server.terminate()
            server.wait(timeout=60)
        print("soak (decoder): " + json.dumps(decoder))


if __name__ == "__main__":
    restart_on_allocator()  # on the allocator the attnkit command runs on (tcmalloc where found), as
    # the server is; the CTranslate2 peer's server too (this script with --peer-server)
    main()
