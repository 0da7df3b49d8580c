"""Translation quality on Multi30k in a fixed training-time budget.

Trains with ``configs/multi30k_{src}_{tgt}.yaml`` for ``--minutes`` of wall time (validation included:
every 90 steps, with greedy BLEU on the first 200 validation sentences so that it stays cheap),
translates test_2016_flickr with beam search from the last checkpoint and from the average of the last 5
(the paper's §6.1), and prints cased, detokenised sacreBLEU with its signature, chrF, and the times.

The batch, warm-up and learning rate are set for a short budget: the recipe's 4,096-token batches and
500-step warm-up suit a 30-epoch run, while 15 CPU minutes are about 3 epochs, where 2,048-token
batches (twice the updates) gave about +10 BLEU (docs/results.md).

Run: ``python bench/quality_multi30k.py --data data/multi30k --minutes 15 --direction de-en`` (the folder
holds Multi30k's raw files, see docs/data.md). The run directory is scratch: an earlier run there is
replaced.
Extra ``section.field=value`` arguments override the recipe (e.g. ``train.eval_every=500`` on a GPU).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from attnkit.checkpoint.average import average_checkpoints
from attnkit.checkpoint.folder import list_checkpoints
from attnkit.config import load_run_config
from attnkit.decode.translate import translate
from attnkit.loading import load_for_inference
from attnkit.metrics import bleu, chrf
from attnkit.processes import resolve_device
from attnkit.tasks.translation import read_split
from attnkit.train.loop import Trainer

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", required=True, help="folder with Multi30k's raw {train,val,test_2016_flickr}.*.gz"
    )
    parser.add_argument("--minutes", type=float, default=15.0, help="training wall-time budget")
    parser.add_argument("--direction", default="de-en", choices=["de-en", "en-de"])
    parser.add_argument("--run-dir", default=None, help="default: runs/quality_multi30k_<direction>")
    parser.add_argument("--average", type=int, default=5, help="checkpoints to average (1 = the last only)")
    parser.add_argument("overrides", nargs="*", help="section.field=value")
    args = parser.parse_args()
    source, target = args.direction.split("-")
    config = load_run_config(
        CONFIGS / f"multi30k_{source}_{target}.yaml",
        [f"data.dir={args.data}", f"train.max_minutes={args.minutes}", "train.max_epochs=0",
         "train.eval_every=90", "train.valid_bleu_sentences=200",
         "train.max_tokens=2048", "train.warmup=200", "train.lr=1.5e-3", *args.overrides],
    )  # fmt: skip
    run_dir = Path(args.run_dir or f"runs/quality_multi30k_{source}_{target}")
    device = resolve_device()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}; "
          f"{args.direction}, {args.minutes} minutes, run directory {run_dir}", flush=True)  # fmt: skip
    began = time.perf_counter()
    trainer = Trainer(config, run_dir, overwrite=True)  # a scratch run: an earlier one is replaced
    trainer.fit()
    trained = time.perf_counter() - began
    checkpoints = list_checkpoints(run_dir)[-args.average :]
    state = trainer.state
    print(f"trained {state.step} steps ({state.epoch} full epochs) in {trained / 60:.1f} min", flush=True)
    candidates = {"last checkpoint": checkpoints[-1]}
    if len(checkpoints) > 1:  # averaging helps late in long runs; early weights can hurt a short one
        candidates[f"average of last {len(checkpoints)}"] = average_checkpoints(
            checkpoints, run_dir / "averaged"
        )
    for name, model_dir in candidates.items():
        model, tokenizer, config = load_for_inference(model_dir, device)
        test = read_split(config.data, "test", config.train.seed)
        began_decoding = time.perf_counter()
        hypotheses = translate(model, tokenizer, test.src, config.decode)
        decoded = time.perf_counter() - began_decoding
        (model_dir / "test_hypotheses.txt").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
        print(f"{name}: beam {config.decode.beam_size}, {len(test)} sentences decoded in {decoded:.0f} s")
        print(f"  multi30k {args.direction} test_2016_flickr {bleu(hypotheses, test.tgt)}")
        print(f"  multi30k {args.direction} test_2016_flickr {chrf(hypotheses, test.tgt)}", flush=True)


if __name__ == "__main__":
    main()
