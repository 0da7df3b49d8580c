"""Speculative decoding against plain greedy search: one checkpoint, the same sentences, the same process.

The first ``--n`` lines of ``--src`` are translated greedily in groups of ``--batch`` sentences (1: each
sentence alone, a single user's latency), in file order, with attnkit's plain greedy search (its own
steps, ``decode.steps=eager``, and with ``--compiled`` the compiled ones, where this machine has a
compiler) and with drafts copied from the source (``decode.speculative=source``) and, where the
checkpoint has one (``attnkit distill-draft``), the guesses of its one-layer draft decoder
(``shallow``), and with ``--draft-ckpt`` the guesses of another checkpoint's smaller model
(``decode.speculative=PATH``), each checked with the same steps as the plain search beside them (with
``--compiled``, the draft's steps compiled too); with ``--ct2``, CTranslate2 (float32 and int8, same weights,
greedy, the same groups, in a process of its own: its threads and torch's in one process slowed both
threefold) beside.
In each round every engine translates every group, one engine after another, ``--rounds`` rounds after
an untimed one; per engine the median over rounds of each group's time is kept. Printed per engine: the
latency per group (p50, p99), target tokens per second over all groups (attnkit's tokenizer counts the
outputs), the ratio to plain greedy with the model's own steps and to plain greedy with the same steps
(``x plain``), how many outputs differ from the latter's (0 for drafts: they are exact; for the
others, from plain greedy's with the model's own steps); then for
drafts the share of drafted tokens the model took and the tokens a row got a step (and the draft's
agreement with the model as ``distill-draft`` measured it). Settings on every side: greedy,
``--threads`` threads, one group at a time, ``decode.precision`` ``--precision``; a summariser's
sources cut as it was trained
(``data.max_source_len``), as ``attnkit predict`` cuts them. ``--src`` is a text file, one source a line
(``.gz`` too), or JSON Lines whose ``--field`` holds each source (a summariser's data).

With drafts, a batch drafts where drafted batches' tokens have cost less so far, and one in 16 the
other way (``Economy``, decode/speculative.py): the rows with drafts show what a user gets, and the
acceptance line counts the batches that drafted. ``--always`` drafts in every batch: what the drafts
themselves cost and save.

A decoder-only checkpoint (GPT) continues prompts instead, greedily (``decode.temperature=0``),
``--new-tokens`` tokens each at most, with ``attnkit generate``'s plain greedy generation and with drafts
copied from each prompt and the text so far (``decode.speculative=source``); ``--prompt-chars K`` cuts
the file's last ``n·K`` characters into ``n`` prompts of ``K`` characters (tiny Shakespeare: the end of
``input.txt``, the recipe's validation text), else each of its first ``n`` lines is a prompt.
``--temperature T`` samples instead (the run's top-k and top-p), each prompt from its own seed: drafts
are then checked by speculative sampling's acceptance rule in every batch, and the texts are samples
of the same distribution, not the same texts (``differ`` counts them all).

Run: ``python bench/speculative.py --ckpt runs/de_en --src data/multi30k/test_2016_flickr.de.gz --n 200
--batch 1 [--compiled] [--ct2] [--always] [--draft-ckpt runs/small]``; a GPT: ``python
bench/speculative.py --ckpt runs/shakespeare --src data/tinyshakespeare/input.txt --prompt-chars 64 --n 50``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnkit.checkpoint.draft_file import draft_about
from attnkit.checkpoint.folder import resolve_checkpoint
from attnkit.config import with_decode_overrides
from attnkit.data.readers import read_lines, read_text
from attnkit.decode.generate import generate
from attnkit.decode.speculative import Economy, Speculation
from attnkit.decode.translate import Reporting, translate
from attnkit.loading import load_for_inference
from attnkit.models.decoder_only import DecoderModel


def ct2_engines(ckpt: str, folder: Path, threads: int) -> dict[str, Callable[[list[str]], list[str]]]:
    """CTranslate2's greedy search on the checkpoint's weights, float32 and int8."""
    from attnkit.convert.export import export_ctranslate2
    from attnkit.decode.ct2 import CTranslate2Translator

    model, tokenizer, config = load_for_inference(ckpt, overrides=["decode.precision=fp32"])
    engines = {}
    for quantization in ("float32", "int8"):
        kind = None if quantization == "float32" else quantization
        out = export_ctranslate2(model, tokenizer, vars(config.decode), folder / quantization, kind)
        settings = ["decode.streams=1", f"decode.batch_size={threads * 1000}"]
        translator = CTranslate2Translator(Path(out), settings)
        engines[f"ctranslate2-{quantization}"] = lambda texts, t=translator: t.translate(texts, beam_size=1)
    return engines


def timed_round(engines: dict[str, Callable[[list[str]], list[str]]], groups: list[list[str]]) -> dict:
    """Every engine on every group, one engine after another: ``{engine: (seconds per group, outputs)}``."""
    done = {}
    for name, run in engines.items():
        seconds, outputs = [], []
        for group in groups:
            began = time.perf_counter()
            outputs += run(group)
            seconds.append(time.perf_counter() - began)
        done[name] = (seconds, outputs)
    return done


def _ct2_child(conn, ckpt: str, groups: list[list[str]], threads: int) -> None:
    """In a process of its own (CTranslate2's threads and torch's in one process slowed both
    threefold here): a round of CTranslate2's engines whenever asked; None ends it."""
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as folder:
        engines = ct2_engines(ckpt, Path(folder), threads)
        while conn.recv() is not None:
            conn.send(timed_round(engines, groups))


class _Peer:
    """CTranslate2 in a process of its own (:func:`_ct2_child`), asked for a round at a time."""

    def __init__(self, args, groups: list[list[str]]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_ct2_child, args=(child, args.ckpt, groups, args.threads))
        self.process.start()

    def round(self) -> dict:
        self.conn.send(True)
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--field", help="--src is JSON Lines: the field that holds each source")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--compiled", action="store_true", help="plain greedy with compiled steps too")
    parser.add_argument("--ct2", action="store_true", help="CTranslate2 float32 and int8 beside")
    always = "check drafts in every batch: the drafts' own cost, not the economy's choice"
    parser.add_argument("--always", action="store_true", help=always)
    parser.add_argument("--new-tokens", type=int, default=100, help="a GPT's tokens per prompt, at most")
    parser.add_argument("--prompt-chars", type=int, help="a GPT's prompts: pieces of the file's end")
    parser.add_argument("--draft-ckpt", help="another checkpoint's smaller model as a draft too")
    parser.add_argument("--temperature", type=float, default=0.0, help="a GPT's sampling (0: greedy)")
    args = parser.parse_args()
    if args.always:  # every batch drafts (decode/speculative.py's Economy would choose by their costs)
        Economy.drafting = lambda self: True  # type: ignore[method-assign]
    torch.set_num_threads(args.threads)
    about = draft_about(resolve_checkpoint(args.ckpt))  # {} where it has no draft decoder
    loading = [f"decode.precision={args.precision}"] + (["decode.speculative=shallow"] if about else [])
    model, tokenizer, config = load_for_inference(args.ckpt, overrides=loading)
    models = {"": model}  # the model each row runs, by the draft it holds (--draft-ckpt: another copy)
    if args.draft_ckpt:
        with_draft = [f"decode.precision={args.precision}", f"decode.speculative={args.draft_ckpt}"]
        models[args.draft_ckpt] = load_for_inference(args.ckpt, overrides=with_draft)[0]
    continues = isinstance(model, DecoderModel)  # a GPT continues prompts (generate)
    texts = _prompts(args) if continues else _sources(args)
    groups = [texts[i : i + args.batch] for i in range(0, len(texts), args.batch)]
    common = ["decode.beam_size=1", "decode.streams=1", f"decode.batch_size={args.batch}"]
    if continues:
        common += [f"decode.temperature={args.temperature}", f"decode.max_new_tokens={args.new_tokens}"]
    settings: dict[str, list[str]] = {}
    kinds = [("source drafts", "source")] + ([("shallow draft", "shallow")] if about else [])
    kinds += [("draft model", args.draft_ckpt)] if args.draft_ckpt else []
    for steps in ["eager", "compiled"] if args.compiled and not continues else ["eager"]:
        which = "" if steps == "eager" else ", compiled steps"
        settings[f"greedy{which}"] = [f"decode.steps={steps}", "decode.speculative=none"]
        for drafts, kind in kinds:
            settings[f"greedy{which}, {drafts}"] = [f"decode.steps={steps}", f"decode.speculative={kind}"]
    counts = {name: Speculation() for name in settings if "draft" in name}
    # a summariser reads its sources cut as in training (data.max_source_len), as its commands do
    limit = config.data.source_limit if config.data.task == "summarise" else None
    engines: dict[str, Callable[[list[str]], list[str]]] = {}
    for name, changes in settings.items():
        decode = with_decode_overrides(config.decode, common + changes)
        runs = models.get(decode.speculative, model)
        if continues:
            counted = counts.get(name)
            engines[name] = lambda group, d=decode, c=counted, m=runs: generate(
                m, tokenizer, group, d, speculation=c
            )
            continue
        reporting = Reporting(speculation=counts.get(name))
        engines[name] = lambda group, d=decode, r=reporting, m=runs: translate(
            m, tokenizer, group, d, reporting=r, source_limit=limit
        )
    times: dict[str, list[list[float]]] = {}
    outputs: dict[str, list[str]] = {}
    if args.ct2 and continues:
        print("the CTranslate2 rows are a translator's: skipped for a GPT")
        args.ct2 = False
    if args.ct2 and not importlib.util.find_spec("ctranslate2"):
        print("ctranslate2 is not installed: its rows are skipped")
        args.ct2 = False
    peer = _Peer(args, groups) if args.ct2 else None
    try:
        for round_ in range(args.rounds + 1):
            done = timed_round(engines, groups)
            if peer is not None:
                done.update(peer.round())
            for name, (seconds, out) in done.items():
                if round_:
                    for g, each in enumerate(seconds):
                        times.setdefault(name, [[] for _ in groups])[g].append(each)
                else:  # the untimed round's outputs are compared
                    outputs[name] = out
    finally:
        if peer is not None:
            peer.close()
    ended = 0 if continues else 1  # (a translation's </s>; a continuation stops at its length, mostly)
    tokens = {name: sum(len(tokenizer.encode(o)) + ended for o in outs) for name, outs in outputs.items()}
    base = sum(statistics.median(t) for t in times["greedy"])
    what = f"prompts, up to {args.new_tokens} new tokens each" if continues else "sentences"
    sampling = continues and args.temperature > 0  # (the rows keep their greedy names)
    searched = (
        f"sampling at temperature {args.temperature:g} (texts differ by design)" if sampling else "greedy"
    )
    print(
        f"{args.ckpt}: {len(texts)} {what} of {args.src} in groups of {args.batch}, {searched}, "
        f"{args.threads} threads, decode.precision={config.decode.precision}, {args.rounds} rounds"
    )
    print(f"{'engine':42} {'p50 ms':>8} {'p99 ms':>8} {'tokens/s':>9} {'x greedy':>9} {'x plain':>8} "
          f"{'differ':>7}")  # fmt: skip
    for name in times:
        each = sorted(statistics.median(t) for t in times[name])
        total = sum(each)
        p99 = each[min(len(each) - 1, round(0.99 * (len(each) - 1)))]
        same_steps = name.rsplit(", ", 1)[0] if "draft" in name else "greedy"  # its plain search
        plain_total = sum(statistics.median(t) for t in times[same_steps])
        differ = sum(a != b for a, b in zip(outputs[name], outputs[same_steps], strict=True))
        p50 = statistics.median(each)
        print(f"{name:42} {1000 * p50:8.1f} {1000 * p99:8.1f} {tokens[name] / total:9.0f} "
              f"{base / total:9.2f} {plain_total / total:8.2f} {differ:7d}")  # fmt: skip
    rounds = args.rounds + 1  # counted in every round, the untimed one too (each drafts alike)
    for name, count in counts.items():
        print(
            f"{name}: {count.acceptance:.1%} of {count.proposed // rounds} drafted tokens "
            f"taken, {count.per_step:.2f} tokens a row a step"
        )
    if about:
        print(f"the draft decoder: {about}")


def _sources(args) -> list[str]:
    """The first ``--n`` sources of ``--src``, one a line (its ``--field`` of JSON Lines)."""
    lines = read_lines(args.src)
    texts = [json.loads(line)[args.field] for line in lines] if args.field else lines
    return [" ".join(text.split()) for text in texts[: args.n]]  # (one line each)


def _prompts(args) -> list[str]:
    """A GPT's ``--n`` prompts: pieces of ``--prompt-chars`` characters of the file's end, or its first
    lines."""
    if args.prompt_chars is None:
        return [line for line in read_lines(args.src) if line.strip()][: args.n]
    text = read_text(args.src)
    end = text[len(text) - args.n * args.prompt_chars :]
    return [end[i : i + args.prompt_chars] for i in range(0, len(end), args.prompt_chars)]


if __name__ == "__main__":
    main()
