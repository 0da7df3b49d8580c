"""Translation speed on the CPU: one checkpoint, the same sentences, three engines.

attnkit's own search, HF transformers' ``MarianMTModel.generate`` on the same weights (``attnkit export
--to hf``) and CTranslate2 (``attnkit export --to ctranslate2``, float32 and int8 weights) translate the
first ``--n`` lines of ``--src`` in batches of ``--batch`` sentences, greedy and with beam search, on
``--threads`` threads. Each row: target tokens per second (attnkit's tokenizer counts the outputs), the
outputs' sacreBLEU against ``--ref`` (to show they translate alike) and the ratio of attnkit's speed to
the engine's. Settings on every side: no sampling, the start token ``<s>``, ``<pad>`` and ``<s>`` never
produced; beam search's length normalisation is each engine's own (attnkit: GNMT's with the run's α;
HF: its default, length^1; CTranslate2: length^α), and it is printed.

Run: ``python bench/translate_speed.py --ckpt runs/de_en --src data/multi30k/test_2016_flickr.de.gz
--ref data/multi30k/test_2016_flickr.en.gz --n 500`` (the HF rows need ``transformers``, the CTranslate2
rows ``ctranslate2``; an engine that is not installed is skipped with a note).
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnkit.data.readers import read_parallel
from attnkit.decode.ct2 import CTranslate2Engine
from attnkit.decode.translate import translate
from attnkit.metrics import bleu
from attnkit.models.convert.export import export_ctranslate2, export_hf
from attnkit.train.checkpoint import load_for_inference


def hf_translator(folder: Path, tokenizer, batch: int) -> Callable[[list[str], int], list[str]]:
    """HF ``generate`` over batches of ``batch`` sentences, sources encoded as attnkit encodes them."""
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(folder).eval()
    s = tokenizer.specials

    def run(texts: list[str], beam: int) -> list[str]:
        outputs = []
        for start in range(0, len(texts), batch):
            ids = [[*row, s.eos] for row in tokenizer.encode_batch(texts[start : start + batch])]
            longest = max(map(len, ids))
            padded = torch.tensor([row + [s.pad] * (longest - len(row)) for row in ids])
            with torch.inference_mode():
                out = model.generate(padded, attention_mask=padded != s.pad, num_beams=beam, do_sample=False,
                                     max_new_tokens=int(1.5 * longest + 10))  # fmt: skip
            outputs += [tokenizer.decode(row) for row in out.tolist()]  # without <s>, up to </s>
        return outputs

    return run


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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer, config = load_for_inference(args.ckpt)
    pairs = read_parallel(Path(args.src), Path(args.ref))
    sources, references = pairs.src[: args.n], pairs.tgt[: args.n]
    decode = config.decode
    decode.batch_size = args.batch
    scratch = Path(tempfile.mkdtemp(prefix="translate_speed."))
    engines: dict[str, Callable[[list[str], int], list[str]]] = {
        "attnkit": lambda texts, beam: translate(model, tokenizer, texts, decode, beam_size=beam),
    }
    if importlib.util.find_spec("transformers"):
        engines["hf-generate"] = hf_translator(
            export_hf(model, tokenizer, scratch / "hf"), tokenizer, args.batch
        )
    else:
        print("note: transformers is not installed; no HF rows")
    if importlib.util.find_spec("ctranslate2"):
        for name, quantization in (("ctranslate2", None), ("ctranslate2-int8", "int8")):
            folder = export_ctranslate2(model, tokenizer, vars(decode), scratch / name, quantization)
            engines[name] = CTranslate2Engine(folder).translate  # loaded once, outside the timed runs
    else:
        print("note: ctranslate2 is not installed; no CTranslate2 rows")
    print(f"torch {torch.__version__}, {args.threads} threads, {len(sources)} sentences of {args.src}, batch "
          f"{args.batch}; attnkit's α = {decode.alpha}, HF's length_penalty = 1.0 (its default)")  # fmt: skip
    print("| engine | beam | seconds | target tokens/s | sacreBLEU | attnkit / engine speed |")
    print("|---|---|---|---|---|---|")
    for beam in [int(b) for b in args.beams.split(",")]:
        speeds = {}
        for name, run in engines.items():
            run(sources[: args.batch], beam)  # warm-up: first-call allocations and lazy loading
            began = time.perf_counter()
            outputs = run(sources, beam)
            seconds = time.perf_counter() - began
            tokens = sum(len(ids) + 1 for ids in tokenizer.encode_batch(outputs))  # + </s>
            speeds[name] = tokens / seconds
            ratio = speeds["attnkit"] / speeds[name]
            score = bleu(outputs, references).score
            print(
                f"| {name} | {beam} | {seconds:.1f} | {speeds[name]:,.0f} | {score:.2f} | {ratio:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
