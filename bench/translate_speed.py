"""Translation speed on the CPU: one checkpoint, the same sentences, three engines.

attnkit's own search, HF transformers' ``MarianMTModel.generate`` on the same weights (``attnkit export
--to hf``) and CTranslate2 (``attnkit export --to ctranslate2``, float32 and int8 weights) translate the
first ``--n`` lines of ``--src`` in batches of ``--batch`` sentences, greedy and with beam search, on
``--threads`` threads. Each row: target tokens per second (attnkit's tokenizer counts the outputs), the
outputs' sacreBLEU against ``--ref`` (to show they translate alike) and the ratio of attnkit's speed to
the engine's. attnkit runs in each precision of ``--precisions``: ``attnkit`` is float32,
``attnkit-bf16`` multiplies its linear maps in bf16 (``--precision bf16``, the processor's bf16 units;
CTranslate2 has no bf16 on CPU), ``attnkit-int8`` in int8 weights and activations (``--int8``, as
CTranslate2's int8); with ``--compile``, each again with its decoding step compiled
(``attnkit-compiled``, ``attnkit-bf16-compiled``, ...). The lines after the table give, per beam, how
many of each attnkit row's outputs are float32 attnkit's and its BLEU's distance from it, and the
fastest attnkit row against CTranslate2's float32 and int8. Settings on every side: no sampling, the
start token ``<s>``, ``<pad>`` and ``<s>`` never produced; beam search ranks finished hypotheses by log
P / length^α on every side, with ``--alpha`` (default: the run's ``decode.alpha``), each with its own
stopping rule (attnkit's default and HF's: a sentence is done when no running beam can beat its K
finished hypotheses; CTranslate2's: as soon as it has K). Every engine translates ``--streams`` batches
at a time, each on its share of the threads (0, the default: one per thread, as ``attnkit translate``
does; CTranslate2's ``inter_threads``; HF's batches on as many Python threads), so that the engines
split their threads alike; ``--streams 1`` is one batch at a time on all of them. Each engine runs in
its own process, ``--rounds`` timed runs after an untimed one, the engines taking turns (round k of
every engine within the same minute); the table gives the median time and the median, lowest and highest
of the rounds' speed ratios.

Run: ``python bench/translate_speed.py --ckpt runs/de_en --src data/multi30k/test_2016_flickr.de.gz
--ref data/multi30k/test_2016_flickr.en.gz --n 500 [--compile] [--precisions fp32,bf16,int8]`` (the HF
rows need ``transformers``, the CTranslate2 rows ``ctranslate2``; an engine that is not installed is
skipped with a note).
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnkit.config import with_decode_overrides
from attnkit.convert.export import export_ctranslate2, export_hf
from attnkit.cpu.allocator import chosen, preloaded
from attnkit.data.batching import length_batches, pad
from attnkit.data.readers import read_parallel
from attnkit.decode.ct2 import CTranslate2Translator
from attnkit.decode.streams import fill_by_batch, stream_count
from attnkit.decode.translate import translate
from attnkit.loading import load_for_inference
from attnkit.metrics import bleu


def hf_translator(
    folder: Path, tokenizer, batch: int, alpha: float, streams: int
) -> Callable[[list[str], int], list[str]]:
    """HF ``generate`` over the batches attnkit makes (``batch`` sentences of similar length), sources
    encoded as attnkit encodes them; ``streams`` batches at a time, as attnkit's (decode/streams.py)."""
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(folder).eval()
    s = tokenizer.specials

    def run(texts: list[str], beam: int) -> list[str]:
        encoded = [[*row, s.eos] for row in tokenizer.encode_batch(texts)]

        def generate(chunk: list[int]) -> list[list[int]]:
            padded = pad([encoded[i] for i in chunk], s.pad)
            with torch.inference_mode():
                longest = 1 + int(1.5 * padded.size(1) + 10)  # <s> + attnkit's bound
                return model.generate(padded, attention_mask=padded != s.pad, num_beams=beam, do_sample=False,
                                      length_penalty=alpha, max_length=longest).tolist()  # fmt: skip

        chunks = length_batches(range(len(texts)), [len(ids) for ids in encoded], batch)
        rows = fill_by_batch(generate, chunks, stream_count(streams, "cpu", len(chunks)), [[]] * len(texts))
        return [tokenizer.decode(row) for row in rows]  # without <s>, up to </s>

    return run


def serve_engine(
    conn,
    engine: str,
    folder: str,
    ckpt: str,
    sources: list[str],
    batch: int,
    threads: int,
    alpha: float,
    streams: int,
) -> None:
    """In a process of its own: load ``engine`` (from ``folder``; attnkit from ``ckpt``) and send back the
    batch size and α it will search with; then, for each beam size ``conn`` sends, translate ``sources``
    once (after an untimed run the first time) and send back the seconds and the outputs; None ends it."""
    torch.set_num_threads(threads)
    precision = next((p for p in ("bf16", "int8") if f"-{p}" in engine), "fp32")
    model, tokenizer, config = load_for_inference(ckpt, overrides=[f"decode.precision={precision}"])
    # the same settings for attnkit and CTranslate2, which read them alike (HF generate takes arguments)
    settings = [f"decode.batch_size={batch}", "decode.length_penalty=length", f"decode.alpha={alpha}",
                f"decode.streams={streams}"]  # fmt: skip
    # attnkit: its own steps, or (-compiled) the compiled ones, never as the cache has it (auto)
    steps = ["decode.steps=compiled" if engine.endswith("-compiled") else "decode.steps=eager"]
    decode = with_decode_overrides(config.decode, settings + steps)
    if engine.startswith("attnkit"):
        run = lambda texts, beam: translate(model, tokenizer, texts, decode, beam_size=beam)  # noqa: E731
        conn.send((decode.batch_size, decode.alpha))
    elif engine == "hf-generate":
        run = hf_translator(Path(folder), tokenizer, batch, alpha, streams)
        conn.send((batch, alpha))  # what generate is called with
    else:  # loaded once, outside the timed runs
        ct2 = CTranslate2Translator(Path(folder), settings)
        run = ct2.translate
        conn.send((ct2.decode.batch_size, ct2.decode.alpha))
    warmed = set()
    while (beam := conn.recv()) is not None:
        if beam not in warmed:  # the first run pays for allocations, lazy loading and kernel choices
            run(sources, beam)
            warmed.add(beam)
        began = time.perf_counter()
        outputs = run(sources, beam)
        conn.send((time.perf_counter() - began, outputs))


def interleaved_times(
    folders: dict[str, str], args, sources: list[str], beams: list[int], alpha: float, library: str | None
):
    """``{engine: {beam: [seconds per round]}}`` and ``{engine: {beam: outputs}}``, each engine in its
    own process (a library's thread pool, CTranslate2's OpenMP runtime, slows the engines that run after
    it in the same process by half). The rounds are interleaved, every engine's k-th run within the same
    minute, so that the machine's drift (other tenants of its cores, clock changes) weighs on all
    engines alike; a pause after each run lets an engine's worker threads stop spinning before the next
    engine starts. ``library``: the allocator each engine's process preloads (None: the system's)."""
    spawn = multiprocessing.get_context("spawn")
    workers = {}
    for name, folder in folders.items():
        ours, theirs = spawn.Pipe()
        work = (theirs, name, folder, args.ckpt, sources, args.batch, args.threads, alpha, args.streams)
        process = spawn.Process(target=serve_engine, args=work)
        with preloaded(library):  # each engine on the allocator the attnkit command runs on
            process.start()
        workers[name] = (process, ours)
    settings = {name: conn.recv() for name, (_, conn) in workers.items()}  # (batch size, α) of each
    if len(set(settings.values())) > 1:
        for process, _ in workers.values():
            process.kill()
        raise SystemExit(f"the engines would not search alike: (batch size, α) {settings}")
    times = {name: {beam: [] for beam in beams} for name in folders}
    outputs = {name: {} for name in folders}  # the same every round: the searches are deterministic
    for beam in beams:
        for _ in range(args.rounds):
            for name, (_, conn) in workers.items():
                conn.send(beam)
                seconds, outputs[name][beam] = conn.recv()
                times[name][beam].append(seconds)
                time.sleep(PAUSE_S)
    for process, conn in workers.values():
        conn.send(None)
        process.join()
    return times, outputs


PAUSE_S = 0.5  # after each run: CTranslate2's OpenMP threads spin for 200 ms after their last task


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", required=True, help="a translation run directory or checkpoint folder")
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--n", type=int, default=500, help="sentences (the first N)")
    parser.add_argument("--beams", default="1,5", help="beam sizes, comma-separated (1 = greedy)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    streams_help = "batches at a time on every engine, each on its share of the threads; 0: one per thread"
    parser.add_argument("--streams", type=int, default=0, help=streams_help)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per engine and beam (the median)")
    parser.add_argument("--alpha", type=float, default=None, help="length^α (default: the run's)")
    compile_help = "also attnkit with decode.compile (its decoding step compiled ahead of time)"
    parser.add_argument("--compile", action="store_true", help=compile_help)
    precisions_help = "attnkit's precisions, comma-separated: fp32 (always), bf16, int8"
    parser.add_argument("--precisions", default="fp32,bf16,int8", help=precisions_help)
    args = parser.parse_args()
    model, tokenizer, config = load_for_inference(args.ckpt)
    pairs = read_parallel(Path(args.src), Path(args.ref))
    sources, references = pairs.src[: args.n], pairs.tgt[: args.n]
    decode = config.decode
    decode.length_penalty = "length"
    decode.alpha = decode.alpha if args.alpha is None else args.alpha
    scratch = Path(tempfile.mkdtemp(prefix="translate_speed."))
    precisions = ["fp32", *(p for p in args.precisions.split(",") if p != "fp32")]
    ours = [
        name
        for compiled in ([False, True] if args.compile else [False])
        for p in precisions
        if (name := "attnkit" + ("" if p == "fp32" else f"-{p}") + ("-compiled" if compiled else ""))
    ]
    folders = dict.fromkeys(ours, "")
    if importlib.util.find_spec("transformers"):
        folders["hf-generate"] = str(export_hf(model, tokenizer, scratch / "hf"))
    else:
        print("note: transformers is not installed; no HF rows")
    if importlib.util.find_spec("ctranslate2"):
        for name, quantization in (("ctranslate2", None), ("ctranslate2-int8", "int8")):
            folder = export_ctranslate2(model, tokenizer, vars(decode), scratch / name, quantization)
            folders[name] = str(folder)
    else:
        print("note: ctranslate2 is not installed; no CTranslate2 rows")
    beams = [int(b) for b in args.beams.split(",")]
    library = chosen()  # the allocator the attnkit command runs on, for each engine's process
    times, outputs = interleaved_times(folders, args, sources, beams, decode.alpha, library)
    torch.set_num_threads(args.threads)  # as in the engines' processes, for the count they compute
    streams = stream_count(args.streams, "cpu", batches=-(-len(sources) // args.batch))
    print(f"torch {torch.__version__}, {args.threads} threads, {len(sources)} sentences of {args.src}, batch "
          f"{args.batch}, {streams} batch(es) at a time on {args.threads // streams} thread(s) each on every "
          f"engine, {args.rounds} rounds, each engine in its own process (allocator {library or 'malloc'}), "
          f"their runs interleaved; "
          f"beam search's score: log P / length^{decode.alpha} on every side (each engine's batch size and "
          f"α as it reported them)")  # fmt: skip
    print(
        "| engine | beam | seconds (median) | target tokens/s | sacreBLEU | attnkit / engine speed "
        "(median of the rounds; lowest–highest) |"
    )
    print("|---|---|---|---|---|---|")

    def target_tokens(outputs: list[str]) -> int:
        return sum(len(ids) + 1 for ids in tokenizer.encode_batch(outputs))  # + </s>

    def speed_ratios(mine: str, other: str, beam: int) -> str:
        """``mine``'s target tokens/s over ``other``'s, round by round: median (lowest–highest)."""
        speeds = [[target_tokens(outputs[name][beam]) / seconds for seconds in times[name][beam]]
                  for name in (mine, other)]  # fmt: skip
        ratios = [a / b for a, b in zip(*speeds, strict=True)]
        return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"

    for beam in beams:
        for name in folders:
            tokens = target_tokens(outputs[name][beam])
            seconds = statistics.median(times[name][beam])
            score = bleu(outputs[name][beam], references).score
            ratio = speed_ratios("attnkit", name, beam)
            print(f"| {name} | {beam} | {seconds:.2f} | {tokens / seconds:,.0f} | {score:.2f} | {ratio} |")
    for beam in beams if args.compile else []:
        same = outputs["attnkit-compiled"][beam] == outputs["attnkit"][beam]
        against = ", ".join(f"{name}'s {speed_ratios('attnkit-compiled', name, beam)}"
                            for name in folders if name != "attnkit-compiled")  # fmt: skip
        verdict = "are" if same else "are NOT"
        print(f"beam {beam}: attnkit-compiled's outputs {verdict} attnkit's; its speed / {against}")
    float32 = {beam: bleu(outputs["attnkit"][beam], references).score for beam in beams}
    for beam in beams:
        for name in ours[1:]:
            found, reference = outputs[name][beam], outputs["attnkit"][beam]
            same = sum(a == b for a, b in zip(found, reference, strict=True)) / len(found)
            delta = bleu(found, references).score - float32[beam]
            print(f"beam {beam}: {name}: {same:.1%} of the outputs are float32 attnkit's, BLEU {delta:+.2f}")
        fastest = min(ours, key=lambda name: statistics.median(times[name][beam]))
        against = ", ".join(f"{name}'s {speed_ratios(fastest, name, beam)}" for name in folders
                            if name.startswith("ctranslate2"))  # fmt: skip
        versus = f"; its speed / {against}" if against else ""
        print(f"beam {beam}: the fastest attnkit row is {fastest}{versus}")


if __name__ == "__main__":
    main()
