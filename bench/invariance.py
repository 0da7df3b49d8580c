"""How many translations change with the batch: each sentence of a file translated alone, then in
batches, with the same weights and settings, for each of attnkit's precisions and for its peers:
CTranslate2 (``translate_batch`` alone and in batches, float32 and int8 weights exported from the same
checkpoint) and HF transformers' ``generate`` (``MarianMTModel``, float32, ``attnkit export --to hf``;
every sentence bounded to the same number of new tokens, so that only the batch differs).

A translation is a function of its sentence and the settings (docs/invariance.md): every attnkit row
should read 0. Counted are the n-best lines (text and score) that differ, and the sentences whose best
translation differs. The batches are ``--batch`` sentences of similar length, as both engines make them
(the tests also draw random batchmates of mixed lengths: tests/decode/test_batch_invariance.py).

``--bf16-one-product`` adds a row of attnkit in bf16 with each linear map one oneDNN product, as before
wide maps were multiplied by blocks of inputs on processors whose bf16 sums depend on the rows (AMX
tiles: ``attnkit.cpu.linear.bf16_rows_alike``): what the blocks keep fixed there, and their price
(the model's own steps; a compiled step's cache does not tell the two apart).

Run: ``python bench/invariance.py --ckpt RUN --src FILE [--lines 1000] [--beam 5] [--n-best 2]
[--batch 64] [--engines attnkit,ctranslate2,hf] [--steps eager,compiled] [--bf16-one-product]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import attnkit.cpu.linear as linear
from attnkit.convert.export import export_ctranslate2, export_hf
from attnkit.data.batching import length_batches, pad
from attnkit.data.readers import read_lines
from attnkit.decode.ct2 import CTranslate2Translator
from attnkit.decode.translate import translate
from attnkit.loading import load_for_inference

Translations = list[list[tuple[str, float]]]


def differences(alone: Translations, batched: Translations) -> tuple[int, int, int]:
    """(n-best lines that differ, sentences whose best translation differs, lines)."""
    lines = sum(len(hypotheses) for hypotheses in alone)
    pairs = list(zip(alone, batched, strict=True))
    differ = sum(a != b for mine, theirs in pairs for a, b in itertools.zip_longest(mine, theirs))
    best = sum(
        mine[:1] != theirs[:1] and (not mine or not theirs or mine[0][0] != theirs[0][0])
        for mine, theirs in pairs
    )
    return differ, best, lines


def hf_peer(ckpt: str, folder: Path, n_best: int, beam: int, bound: int):
    """HF ``generate`` of the checkpoint's weights (exported to ``folder``) as a ``(texts, batch size) ->
    n best`` function: sources encoded as attnkit encodes them, in batches of similar length, each
    output at most ``bound`` new tokens; the scores are HF's (``sequences_scores``)."""
    from transformers import MarianMTModel

    model, tokenizer, config = load_for_inference(ckpt, overrides=["decode.precision=fp32"])
    hf = MarianMTModel.from_pretrained(export_hf(model, tokenizer, folder)).eval()
    specials = tokenizer.specials

    def run(group: list[str], size: int) -> Translations:
        encoded = [[*ids, specials.eos] for ids in tokenizer.encode_batch(group)]
        found: Translations = [[] for _ in group]
        for chunk in length_batches(range(len(group)), [len(ids) for ids in encoded], size):
            src = pad([encoded[i] for i in chunk], specials.pad)  # (B, S)
            with torch.inference_mode():
                out = hf.generate(src, attention_mask=src != specials.pad, num_beams=beam,
                                  num_return_sequences=n_best, do_sample=False, max_length=1 + bound,
                                  length_penalty=config.decode.alpha, output_scores=True,
                                  return_dict_in_generate=True)  # fmt: skip
            sequences, scores = out.sequences.tolist(), out.sequences_scores.tolist()
            for j, i in enumerate(chunk):
                rows = range(j * n_best, (j + 1) * n_best)
                found[i] = [(tokenizer.decode(sequences[r]), scores[r]) for r in rows]
        return found

    return run


Row = tuple[str, Callable[[list[str], int], Translations]]  # a name, and (texts, batch size) -> n best


def attnkit_rows(args: argparse.Namespace) -> list[Row]:
    """attnkit in each precision, with the model's steps and with compiled ones (``--steps``)."""
    rows = []
    for precision in ("fp32", "bf16", "int8"):
        model, tokenizer, config = load_for_inference(args.ckpt, overrides=[f"decode.precision={precision}"])
        for compiled in [kind == "compiled" for kind in args.steps.split(",")]:

            def ours(group: list[str], size: int, model=model, tokenizer=tokenizer, config=config,
                     compiled=compiled) -> Translations:  # fmt: skip
                decode = dataclasses.replace(
                    config.decode, batch_size=size, steps="compiled" if compiled else "eager"
                )
                return translate(model, tokenizer, group, decode, n_best=args.n_best, beam_size=args.beam)

            rows.append(
                (f"attnkit {config.decode.precision}" + (", compiled steps" if compiled else ""), ours)
            )
    return rows


def one_product_row(args: argparse.Namespace) -> Row:
    """attnkit in bf16, the model's own steps, with each map one product whatever this CPU's bf16 sums
    do (``--bf16-one-product``)."""
    real = linear.bf16_rows_alike
    linear.bf16_rows_alike = lambda: True  # what the layers ask when they pack their bf16 copies
    try:
        model, tokenizer, config = load_for_inference(args.ckpt, overrides=["decode.precision=bf16"])
    finally:
        linear.bf16_rows_alike = real

    def ours(group: list[str], size: int) -> Translations:
        decode = dataclasses.replace(config.decode, batch_size=size, steps="eager")
        return translate(model, tokenizer, group, decode, n_best=args.n_best, beam_size=args.beam)

    kind = "rows summed alike among any rows here" if real() else "rows summed by their batch here: AMX"
    return f"attnkit bf16, one product per map ({kind})", ours


def ctranslate2_rows(args: argparse.Namespace) -> list[Row]:
    """CTranslate2 with float32 and int8 weights exported from the checkpoint."""
    if not importlib.util.find_spec("ctranslate2"):
        print("note: ctranslate2 is not installed; no CTranslate2 rows")
        return []
    model, tokenizer, config = load_for_inference(args.ckpt, overrides=["decode.precision=fp32"])
    scratch, rows = Path(tempfile.mkdtemp(prefix="invariance-")), []
    for quantization in (None, "int8"):
        folder = export_ctranslate2(
            model, tokenizer, vars(config.decode), scratch / str(quantization), quantization
        )

        def peer(group: list[str], size: int, folder=folder) -> Translations:
            translator = CTranslate2Translator(folder, [f"decode.batch_size={size}"])
            return translator.translate_n_best(group, args.n_best, beam_size=args.beam)

        rows.append((f"CTranslate2 {quantization or 'float32'}", peer))
    return rows


def hf_rows(args: argparse.Namespace, texts: list[str]) -> list[Row]:
    """HF ``generate`` in float32, every output bounded to twice the longest source and ten tokens."""
    if not importlib.util.find_spec("transformers"):
        print("note: transformers is not installed; no HF row")
        return []
    longest = max(len(ids) for ids in load_for_inference(args.ckpt)[1].encode_batch(texts)) + 1
    run = hf_peer(args.ckpt, Path(tempfile.mkdtemp()), args.n_best, args.beam, 2 * longest + 10)
    return [("HF generate float32", run)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", required=True, help="a translation run or checkpoint folder")
    parser.add_argument("--src", required=True, help="source sentences, one a line (.gz read too)")
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--n-best", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--engines", default="attnkit,ctranslate2,hf", help="which of them to run")
    parser.add_argument("--steps", default="eager,compiled", help="attnkit's step kinds (compiling: ~20 s)")
    parser.add_argument("--bf16-one-product", action="store_true", help="a row of bf16 without input blocks")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    texts = [line for line in read_lines(args.src)[: args.lines] if line.strip()]
    print(f"{len(texts)} sentences of {args.src}; beam {args.beam}, {args.n_best} best; alone against "
          f"batches of {args.batch}; {args.threads} threads")  # fmt: skip
    print("| engine | n-best lines that differ | best translations that differ | alone s | batched s |")
    print("|---|---|---|---|---|")
    rows = []  # (name, translate(texts, batch size) -> each text's n best)
    engines = set(args.engines.split(","))
    if "attnkit" in engines:
        rows += attnkit_rows(args)
    if args.bf16_one_product:
        rows.append(one_product_row(args))
    if "ctranslate2" in engines:
        rows += ctranslate2_rows(args)
    if "hf" in engines:
        rows += hf_rows(args, texts)
    for name, run in rows:
        began = time.perf_counter()
        alone = run(texts, 1)
        middle = time.perf_counter()
        batched = run(texts, args.batch)
        ended = time.perf_counter()
        differ, best, lines = differences(alone, batched)
        seconds = f"{middle - began:.1f} | {ended - middle:.1f}"
        print(f"| {name} | {differ} of {lines} | {best} of {len(texts)} | {seconds} |")


if __name__ == "__main__":
    main()
