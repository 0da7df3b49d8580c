"""Character-level language modelling quality on tiny Shakespeare in a fixed training-time budget.

Trains a recipe (default ``configs/shakespeare_char.yaml``, nanoGPT's settings) for ``--minutes`` of wall
time, validation included, and prints the validation loss (nats per character) at every validation,
the best one, and the seconds until it first reached ``--target`` (nanoGPT publishes 1.4697 for its
recipe; its CPU setting reaches about 1.88). The last lines print a sample from the best checkpoint.

Run: ``python bench/quality_shakespeare.py --data data/tinyshakespeare --minutes 5
--config configs/shakespeare_char_cpu.yaml``; extra ``section.field=value`` arguments override the
recipe. The run directory is scratch: an earlier run there is replaced.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from attnkit.config import load_run_config
from attnkit.decode.generate import generate
from attnkit.loading import load_for_inference
from attnkit.processes import resolve_device
from attnkit.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, help="folder with tiny Shakespeare's input.txt")
    parser.add_argument("--config", default=str(ROOT / "configs" / "shakespeare_char.yaml"))
    parser.add_argument(
        "--minutes", type=float, default=0.0, help="wall-time budget (0 = the recipe's steps)"
    )
    parser.add_argument(
        "--target", type=float, nargs="*", default=[1.47, 1.80], help="validation losses to time"
    )
    parser.add_argument("--run-dir", default="runs/quality_shakespeare")
    parser.add_argument("overrides", nargs="*", help="section.field=value")
    args = parser.parse_args()
    budget = [f"train.max_minutes={args.minutes}"] if args.minutes else []
    config = load_run_config(args.config, [f"data.dir={args.data}", *budget, *args.overrides])
    device = resolve_device(config.train.device)
    where = (
        torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    )
    print(
        f"torch {torch.__version__} on {where}; {args.config}, {args.minutes or 'no'} minute budget",
        flush=True,
    )
    began = time.perf_counter()
    trainer = Trainer(config, args.run_dir, overwrite=True)
    trainer.fit()
    print(f"trained {trainer.state.step} steps in {(time.perf_counter() - began) / 60:.1f} min")
    history = [(row["step"], row["elapsed_s"], row["valid_loss"]) for row in trainer.state.history]
    for step, seconds, loss in history:
        print(f"  step {step:>5}  {seconds:7.1f} s  valid loss {loss:.4f}")
    print(f"best valid loss = {min(loss for _, _, loss in history):.4f}")
    for target in args.target:
        reached = [seconds for _, seconds, loss in history if loss <= target]
        print(
            f"seconds to valid loss <= {target} = {reached[0]:.1f}"
            if reached
            else f"valid loss {target}: not reached"
        )
    model, tokenizer, config = load_for_inference(args.run_dir, device, prefer="best")
    (sample,) = generate(model, tokenizer, ["\n"], config.decode)
    print("sample from the best checkpoint:\n" + sample[:500])


if __name__ == "__main__":
    main()
