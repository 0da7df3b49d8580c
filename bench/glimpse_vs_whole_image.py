"""Hard attention on images: the glimpse model against a network of the same size that sees every pixel.

Both train on the same generated cluttered digits (data/cluttered_digits.py: 40×40 canvases, 4 pieces of
clutter, 20,000 training canvases from 1,297 digits) for the same wall-time budget, with the same
optimiser (Adam, constant learning rate 1e-3, batch 64, no label smoothing); each keeps its checkpoint
with the best validation accuracy (1,000 canvases of 250 other digits), which is then scored on 1,000
test canvases of the 250 digits neither has seen. The glimpse model's paths on 8 test images are saved
as a picture.

Run: ``python bench/glimpse_vs_whole_image.py --minutes 5 --plot glimpses.png``
(``--runs`` holds the scratch run directories).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from attnkit.checkpoint import load_for_inference
from attnkit.config import load_run_config
from attnkit.tasks.image_classification import accuracy, image_batch, split_canvases
from attnkit.train.loop import Trainer
from attnkit.viz.glimpses import plot_glimpse_paths

MODELS = {"glimpse": ["model.arch=glimpse"], "whole-image": ["model.arch=whole-image"]}
SETTINGS = ["data.n_train=20000", "data.n_valid=1000", "train.batch_size=64", "train.schedule=constant",
            "train.warmup=0", "train.lr=1e-3", "train.label_smoothing=0", "train.eval_every=1000",
            "train.log_every=0", "train.keep_last=1"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="training wall time per model")
    parser.add_argument("--runs", type=Path, default=Path("runs/glimpse_vs_whole_image"))
    parser.add_argument("--plot", type=Path, default=None, help="the glimpse paths' PNG (default: RUNS/...)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.minutes:g} minutes per model "
          "(validation included); fp32, batch 64, no dropout on either side")  # fmt: skip
    print("| model | parameters | steps | minutes | best valid accuracy | test accuracy |")
    print("|---|---|---|---|---|---|")
    for name, model in MODELS.items():
        run = args.runs / name
        config = load_run_config(None, [*model, *SETTINGS, f"train.max_minutes={args.minutes}"])
        began = time.perf_counter()
        trainer = Trainer(config, run, overwrite=True, echo=lambda message: None)
        trainer.fit()
        minutes = (time.perf_counter() - began) / 60
        best, _, config = load_for_inference(run)
        test = split_canvases(config, "test")
        parameters = sum(p.numel() for p in best.parameters())
        valid = max(row["valid_accuracy"] for row in trainer.history)
        print(f"| {name} | {parameters:,} | {trainer.step:,} | {minutes:.1f} | {valid:.3f} | "
              f"{accuracy(best, test, 256, 'cpu'):.3f} |", flush=True)  # fmt: skip
        if name == "glimpse":
            batch = image_batch(test, list(range(8)))
            plot_glimpse_paths(best, batch.images, batch.labels, args.plot or args.runs / "glimpse_paths.png")


if __name__ == "__main__":
    main()
