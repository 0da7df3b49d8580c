"""Hard attention on images: the glimpse model against a network of the same size that sees every pixel.

Both train on the same generated cluttered digits (data/cluttered_digits.py: 40×40 canvases, 4 pieces of
clutter, 20,000 training canvases from 1,297 digits) for the same wall-time budget, with the same
optimiser (Adam, constant learning rate 1e-3, batch 64, no label smoothing); each keeps its checkpoint
with the best validation accuracy (1,000 canvases of 250 other digits), which is then scored on 1,000
test canvases of the 250 digits neither has seen. The glimpse model's paths on 8 test images are saved
as a picture, and how often each of its glimpses is centred on the digit is printed (a place drawn at
random would be on it 16% of the time).

Run: ``python bench/glimpse_vs_whole_image.py --minutes 5 --plot glimpses.png``
(``--runs`` holds the scratch run directories).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from attnkit.config import load_run_config
from attnkit.data.cluttered_digits import DIGIT
from attnkit.loading import load_for_inference
from attnkit.tasks.image_classification import accuracy, image_batch, split_canvases
from attnkit.train.loop import Trainer
from attnkit.viz.glimpses import glimpse_paths, on_digit, plot_glimpse_paths

MODELS = {"glimpse": ["model.arch=glimpse"], "whole-image": ["model.arch=whole-image"]}
SETTINGS = ["data.n_train=20000", "data.n_valid=1000", "train.batch_size=64", "train.schedule=constant",
            "train.warmup=0", "train.lr=1e-3", "train.label_smoothing=0", "train.eval_every=1000",
            "train.log_every=0", "train.keep_last=1"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="training wall time per model")
    parser.add_argument("--runs", type=Path, default=Path("runs/glimpse_vs_whole_image"))
    parser.add_argument("--plot", type=Path, default=None, help="the glimpse paths' PNG (default: RUNS/...)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"which of {', '.join(MODELS)} to train")
    args = parser.parse_args()
    chosen = args.models.split(",")
    if unknown := [name for name in chosen if name not in MODELS]:
        parser.error(f"--models: no model {unknown[0]!r}; choose from {', '.join(MODELS)}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.minutes:g} minutes per model "
          "(validation included); fp32, batch 64, no dropout on either side")  # fmt: skip
    print("| model | parameters | steps | minutes | best valid accuracy | test accuracy |")
    print("|---|---|---|---|---|---|")
    for name in chosen:
        model = MODELS[name]
        run = args.runs / name
        config = load_run_config(None, [*model, *SETTINGS, f"train.max_minutes={args.minutes}"])
        began = time.perf_counter()
        trainer = Trainer(config, run, overwrite=True, echo=lambda message: None)
        trainer.fit()
        minutes = (time.perf_counter() - began) / 60
        best, _, config = load_for_inference(run)
        test = split_canvases(config, "test")
        parameters = sum(p.numel() for p in best.parameters())
        valid = max(row["valid_accuracy"] for row in trainer.state.history)
        print(f"| {name} | {parameters:,} | {trainer.state.step:,} | {minutes:.1f} | {valid:.3f} | "
              f"{accuracy(best, test, 256, 'cpu'):.3f} |", flush=True)  # fmt: skip
        if name == "glimpse":
            batch = image_batch(test, list(range(8)))
            plot_glimpse_paths(best, batch.images, batch.labels, args.plot or args.runs / "glimpse_paths.png")
            locations, _ = glimpse_paths(best, image_batch(test, list(range(len(test)))).images)
            shares = on_digit(locations, test.corners, test.images.size(-1), DIGIT)
            print(f"glimpses centred on the digit, 1st to last, of {len(test)} test canvases: "
                  f"{', '.join(f'{share:.0%}' for share in shares)} (a random place: "
                  f"{(DIGIT / test.images.size(-1)) ** 2:.0%})")  # fmt: skip


if __name__ == "__main__":
    main()
