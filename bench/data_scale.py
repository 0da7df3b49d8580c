"""How start-up scales with the corpus: a parallel corpus is prepared once into a token store, and every
later run, and every process of a run, maps it instead of reading and encoding the text again.

For each corpus size (``--sizes``, in millions of pairs; default 0.1, 1 and 4.5, WMT14's size) it
makes a corpus from Multi30k's training pairs repeated with variations (each copy's sentences end in
the copy's number, so no two pairs are equal; nothing to download), then measures, each in a fresh
process:

- ``attnkit prepare``: wall time and peak RSS (learning BPE 8,000 from a sample of at most
  ``data.tokenizer_sample`` pairs, encoding every pair, writing the store);
- a first ``attnkit train`` without a store (in a store folder of its own): it builds the store
  itself, then trains; seconds to the end of its 2nd step and peak RSS (the building and the training
  in one process);
- ``attnkit train`` of the ``small`` preset, the store ready: seconds from the command's start to the
  end of its 2nd step, and peak RSS;
- the same under ``torchrun --nproc-per-node 2`` (gloo): seconds, and both ranks' peak memory
  together. RSS counts the store's pages, mapped by both ranks, once in each; PSS (proportional set
  size, sampled every 50 ms from /proc) counts each shared page half in each, so the ranks' peak PSS
  added up is what the two take from the machine.

Last, training speed on the smallest corpus: the same run with its pairs read from the store or held
as Python lists (what the trainer had before the store), alternately, ``--rounds`` times; prints
``store/lists tok/s`` (1.00 = the store costs nothing per step).

Run: ``python bench/data_scale.py --data data/multi30k`` (Multi30k's raw files, see docs/data.md); the
corpora and stores go into ``--work`` (a temporary folder by default, deleted at the end): about 0.6 GB
of text and 0.3 GB of store per million pairs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "multi30k_de_en.yaml"
REPORT = "DATA_SCALE_REPORT"  # a child process writes its peak memory into this file (+ its rank)


def make_corpus(multi30k: Path, work: Path, pairs: int) -> Path:
    """``pairs`` de-en pairs in ``work/NAME/train.{de,en}``, Multi30k's training pairs repeated (copy k's
    sentences end in " k"), and Multi30k's validation pairs beside them."""
    folder = work / f"{pairs}"
    if (folder / "train.en").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for side in ("de", "en"):
        with gzip.open(multi30k / f"train.{side}.gz", "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
        with open(folder / f"train.{side}", "w", encoding="utf-8") as out:
            for n in range(pairs):
                copy, line = divmod(n, len(lines))
                out.write(f"{lines[line]} {copy}\n" if copy else f"{lines[line]}\n")
        shutil.copy(multi30k / f"val.{side}.gz", folder / f"val.{side}.gz")
    return folder


def settings(corpus: Path, stores: Path, *extra: str) -> list[str]:
    return [str(CONFIG), "--data", str(corpus), "data.train=[train.de,train.en]", f"data.store={stores}",
            "model.preset=small", "data.vocab_size=8000", *extra]  # fmt: skip


def measure(command: list[str], ranks: int, until: str | None) -> dict:
    """Run ``command`` (attnkit's arguments) in fresh processes (``ranks`` > 1: under torchrun); returns
    the seconds until a stdout line matches ``until`` (or the end) and each process's peak memory."""
    with tempfile.TemporaryDirectory() as reports:
        launcher = [sys.executable, __file__, "--child"]
        if ranks > 1:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={ranks}", __file__, "--child"]  # fmt: skip
        env = {**os.environ, REPORT: str(Path(reports) / "peak"), "PYTHONUNBUFFERED": "1"}
        began, seconds, lines = time.perf_counter(), None, []
        with subprocess.Popen([*launcher, *command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, encoding="utf-8", env=env) as process:  # fmt: skip
            for line in process.stdout:
                lines.append(line)
                if seconds is None and until and re.search(until, line):
                    seconds = time.perf_counter() - began
        if process.returncode:
            raise SystemExit(f"failed ({process.returncode}): {' '.join(command)}\n{''.join(lines[-20:])}")
        peaks = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(Path(reports).iterdir())]
    return {"seconds": seconds or time.perf_counter() - began, "peaks": peaks, "output": "".join(lines)}


def run_child(arguments: list[str]) -> None:
    """Inside a measured process: run attnkit's command line, sampling this process's PSS, and at
    exit write its peak RSS and PSS (MB) to the report file."""
    rollup = Path("/proc/self/smaps_rollup")
    peak_pss = [0]

    def sample() -> None:
        while True:
            text = rollup.read_text(encoding="ascii")
            peak_pss[0] = max(peak_pss[0], int(re.search(r"^Pss:\s+(\d+) kB", text, re.M)[1]))
            time.sleep(0.05)

    if rollup.exists():
        threading.Thread(target=sample, daemon=True).start()

    def report() -> None:
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux
        path = f"{os.environ[REPORT]}.{os.environ.get('RANK', '0')}"
        peaks = {"rss_mb": peak_rss / 1e3, "pss_mb": peak_pss[0] / 1e3 or None}
        Path(path).write_text(json.dumps(peaks), encoding="utf-8")

    import atexit

    atexit.register(report)
    sys.argv = ["attnkit", *arguments]
    from attnkit.cli import main

    main()


def speed(corpus: Path, stores: Path, steps: int, rounds: int) -> list[float]:
    """store/lists training tokens/s of ``rounds`` alternate pairs of runs of ``steps`` steps."""
    from attnkit.config import load_run_config
    from attnkit.tasks import make_task
    from attnkit.train.loop import Trainer

    overrides = [*settings(corpus, stores)[3:], f"data.dir={corpus}", f"train.max_steps={steps}",
                 f"train.eval_every={steps}", "train.valid_bleu_sentences=1"]  # fmt: skip
    config = load_run_config(CONFIG, overrides)

    def as_lists(config, tokenizer, echo):
        task = make_task(config, tokenizer, echo)
        data = task.data
        task.data = replace(data, train_src=list(data.train_src), train_tgt=list(data.train_tgt))
        return task

    ratios = []
    with tempfile.TemporaryDirectory() as runs:
        for k in range(rounds):
            tokens = {}
            for name, factory in (("store", make_task), ("lists", as_lists)):
                trainer = Trainer(config, Path(runs) / f"{name}{k}", echo=lambda m: None, task=factory)
                trainer.fit()
                tokens[name] = trainer.state.history[-1]["tokens_per_s"]
            ratios.append(tokens["store"] / tokens["lists"])
    return ratios


def gb(megabytes: float | None) -> str:
    return "-" if megabytes is None else f"{megabytes / 1e3:.2f}"


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        return run_child(sys.argv[2:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True, help="Multi30k's folder: train/val.{de,en}.gz")
    parser.add_argument("--sizes", default="0.1,1,4.5", help="millions of pairs, comma-separated")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None, help="where corpora and stores go (kept)")
    parser.add_argument("--speed-steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="attnkit-data-scale-"))
    sizes = [round(float(size) * 1e6) for size in args.sizes.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs; preset "
          f"small, BPE 8,000, train.max_tokens 4096; corpora in {work}")  # fmt: skip
    print("| pairs | prepare s | prepare peak RSS GB | first run, store built: s to step 2 | peak RSS GB | "
          "1 rank, store found: s to step 2 | peak RSS GB | peak PSS GB | "
          f"{args.ranks} ranks: s to step 2 | peak RSS GB, each | peak PSS GB, together |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for pairs in sizes:
            corpus, stores = make_corpus(args.data, work, pairs), work / "stores"
            built = measure(["prepare", *settings(corpus, stores)], 1, None)
            found = " (found, not built)" if "built before" in built["output"] else ""
            steps = ["--run-dir", str(work / "run"), "--overwrite", "train.max_steps=2",
                     "train.eval_every=1000", "train.log_every=1",
                     "train.valid_bleu_sentences=1"]  # fmt: skip
            shutil.rmtree(work / "first-stores", ignore_errors=True)
            first = measure(["train", *settings(corpus, work / "first-stores"), *steps], 1, r"^step 2:")
            shutil.rmtree(work / "first-stores", ignore_errors=True)
            train = [*settings(corpus, stores), *steps]
            one = measure(["train", *train], 1, r"^step 2:")
            many = measure(["train", *train], args.ranks, r"step 2:")
            pss = [p["pss_mb"] for p in many["peaks"]]
            row = [f"{pairs:,}", f"{built['seconds']:.0f}{found}", gb(built["peaks"][0]["rss_mb"]),
                   f"{first['seconds']:.1f}", gb(first["peaks"][0]["rss_mb"]),
                   f"{one['seconds']:.1f}", gb(one["peaks"][0]["rss_mb"]), gb(one["peaks"][0]["pss_mb"]),
                   f"{many['seconds']:.1f}", " + ".join(gb(p["rss_mb"]) for p in many["peaks"]),
                   gb(sum(pss)) if None not in pss else "-"]  # fmt: skip
            print(f"| {' | '.join(row)} |", flush=True)
        smallest = make_corpus(args.data, work, min(sizes))
        ratios = speed(smallest, work / "stores", args.speed_steps, args.rounds)
        print(f"training on {min(sizes):,} pairs, {args.speed_steps} steps, {args.rounds} rounds: "
              f"store/lists tok/s = {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}–{max(ratios):.2f})")  # fmt: skip
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
