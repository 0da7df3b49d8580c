"""Summarisation quality on AESLC (email -> subject line) in a fixed training-time budget.

Trains ``configs/aeslc_summarise.yaml`` for ``--minutes`` of wall time (validation included), then runs
``attnkit evaluate``'s scoring on the development set with the best checkpoint (by validation ROUGE-1):
ROUGE-1/2/L F1 with stemming against the original subject and against the three annotators' subjects
(the best of the three counting, the AESLC paper's convention). Anchor: the paper's best system
(Zhang & Tetreault 2019) 23.67 / 10.29 / 23.44 against the annotations.

Run: ``python bench/quality_aeslc.py --data data/aeslc --minutes 15`` (the folder holds train.jsonl.gz and
dev.jsonl.gz, docs/data.md). The run directory is scratch: an earlier run there is replaced. Extra
``section.field=value`` arguments override the recipe.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from typer.testing import CliRunner

from attnkit.cli import app
from attnkit.config import load_run_config
from attnkit.train.loop import Trainer

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "aeslc_summarise.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, help="folder with AESLC's train.jsonl.gz and dev.jsonl.gz")
    parser.add_argument("--minutes", type=float, default=15.0, help="training wall-time budget")
    parser.add_argument("--run-dir", default="runs/quality_aeslc")
    parser.add_argument("overrides", nargs="*", help="section.field=value")
    args = parser.parse_args()
    config = load_run_config(
        CONFIG,
        [
            f"data.dir={args.data}",
            f"train.max_minutes={args.minutes}",
            "train.max_epochs=0",
            *args.overrides,
        ],
    )
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.minutes} minutes", flush=True)
    began = time.perf_counter()
    trainer = Trainer(config, Path(args.run_dir), overwrite=True)
    trainer.fit()
    minutes = (time.perf_counter() - began) / 60
    print(f"trained {trainer.step} steps ({trainer.epoch} full epochs) in {minutes:.1f} min; development "
          "set, best checkpoint:", flush=True)  # fmt: skip
    result = CliRunner().invoke(
        app, ["evaluate", "--ckpt", args.run_dir, "--data", f"{args.data}/dev.jsonl.gz"]
    )
    print(result.output, end="")


if __name__ == "__main__":
    main()
