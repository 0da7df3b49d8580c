"""Choose beam search's length penalty on validation data: sacreBLEU for each kind and exponent.

Beam search ranks finished hypotheses by ``log P(Y|X) / lp(Y)``; ``decode.length_penalty`` picks
``lp``: ``length`` (``|Y| ** alpha``: fairseq, HF ``generate``, CTranslate2) or ``gnmt``
(``((5 + |Y|) / 6) ** alpha``, Wu et al. 2016), and ``decode.alpha`` the exponent. This script decodes
``--src`` with every pair on the grid, prints sacreBLEU against ``--ref`` and the mean output/reference
length ratio, and names the best pair as the settings to give ``attnkit translate`` or ``evaluate``
(``decode.length_penalty=... decode.alpha=...``; or a new run's config). Use validation data, not the
test set, so that the test score stays honest.

Run: ``python bench/length_penalty.py --ckpt runs/de_en --src data/multi30k/val.de.gz
--ref data/multi30k/val.en.gz``
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from sacrebleu.metrics import BLEU

from attnkit.config import BEAM_STOPS, LENGTH_PENALTIES
from attnkit.data.readers import read_parallel
from attnkit.decode.translate import translate
from attnkit.loading import load_for_inference


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", required=True, help="a translation run directory or checkpoint folder")
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--alphas", default="0,0.2,0.4,0.6,0.8,1.0,1.2,1.5", help="comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stop", choices=BEAM_STOPS, default=BEAM_STOPS[0])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer, config = load_for_inference(args.ckpt)
    pairs = read_parallel(Path(args.src), Path(args.ref))
    decode = config.decode
    decode.beam_stop = args.stop
    print(f"{len(pairs.src)} sentences of {args.src}, beam {args.beam}, stopping rule {decode.beam_stop}")
    print("| length penalty | α | sacreBLEU | output / reference length |")
    print("|---|---|---|---|")
    results = {}
    for kind in LENGTH_PENALTIES:
        for alpha in [float(a) for a in args.alphas.split(",")]:
            decode.length_penalty, decode.alpha = kind, alpha
            outputs = translate(model, tokenizer, pairs.src, decode, beam_size=args.beam)
            score = BLEU().corpus_score(outputs, [pairs.tgt])  # sacreBLEU's defaults, as attnkit evaluate
            results[kind, alpha] = score.score
            ratio = score.sys_len / score.ref_len
            print(f"| {kind} | {alpha:g} | {score.score:.2f} | {ratio:.3f} |", flush=True)
    kind, alpha = max(results, key=results.__getitem__)
    best = results[kind, alpha]
    settings = f"decode.length_penalty={kind} decode.alpha={alpha:g} decode.beam_stop={decode.beam_stop}"
    print(
        f"best: {settings} (sacreBLEU {best:.2f}); translate with it: attnkit translate --ckpt {args.ckpt} "
        f"--beam {args.beam} {settings}"
    )


if __name__ == "__main__":
    main()
