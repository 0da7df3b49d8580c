"""The attention family side by side: every variant trained for the same wall-time budget on the same data.

Variants: the Transformer with softmax, ReLU, GELU or sigmoid attention and with a local window; the
RNN encoder-decoder (bidirectional GRU) with Bahdanau, Luong dot / general / concat, local-m, local-p and
hard (REINFORCE) attention, and without attention. Tasks:

- ``dates``: the generated date-normalisation task (character level, no data needed); score: exact
  match of greedy decoding on 500 held-out dates. Small models (Transformer 2+2 layers, d_model 64 as
  ``attnkit quickstart``; RNN d_embed 64, d_hidden 128).
- ``multi30k``: German → English (``--data`` holds Multi30k's raw files, docs/data.md); score: cased,
  detokenised sacreBLEU of beam search (5) on test_2016_flickr. Transformer: configs/multi30k_de_en.yaml
  with the short-budget batch and warm-up of bench/quality_multi30k.py; RNN: the ``rnn-small`` preset
  (d_embed 256, d_hidden 512, as the widely used pytorch-seq2seq tutorials) with the same optimiser.

Each row prints the variant, its parameters, the steps it made, the training minutes, the score, and
how soon validation first reached 99% exact match (dates, where most variants end at 100%) or its best
validation BLEU (Multi30k); a heat map of its attention on the first test sentence goes to ``--plots``.

Run: ``python bench/attention_variants.py --task dates --minutes 2`` or
``python bench/attention_variants.py --task multi30k --data data/multi30k --minutes 15``
(``--variants rnn-bahdanau,rnn-none`` runs a subset). Run directories under ``--runs`` are scratch.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import torch

from attnkit.config import load_run_config
from attnkit.decode.translate import translate
from attnkit.loading import load_for_inference
from attnkit.metrics import bleu, exact_match
from attnkit.tasks.translation import read_split
from attnkit.train.loop import Trainer
from attnkit.viz.attention import plot_translation_attention

ROOT = Path(__file__).resolve().parents[1]

VARIANTS: dict[str, list[str]] = {
    "transformer": [],
    "transformer-relu": ["model.attention_normaliser=relu"],
    "transformer-gelu": ["model.attention_normaliser=gelu"],
    "transformer-sigmoid": ["model.attention_normaliser=sigmoid"],
    "transformer-window": ["model.attention_window=3"],  # each token sees 3 on either side (7 in all)
    "rnn-bahdanau": ["model.attention=bahdanau"],
    "rnn-dot": ["model.attention=dot"],
    "rnn-general": ["model.attention=general"],
    "rnn-concat": ["model.attention=concat"],
    "rnn-local-m": ["model.attention=general", "model.local=local-m"],
    "rnn-local-p": ["model.attention=general", "model.local=local-p"],
    "rnn-hard": ["model.attention=general", "model.hard=true", "model.hard_soft_batches=600"],
    "rnn-none": ["model.attention=none"],
}

# Per task: (recipe file or None, settings for every variant, for the Transformer, for the RNN).
DATES_TRAIN = ["data.task=dates", "data.tokenizer=char", "data.n_train=50000", "data.n_valid=500",
               "train.max_tokens=2000", "train.schedule=inverse_sqrt", "train.lr=2e-3", "train.warmup=200",
               "train.clip_norm=1", "train.label_smoothing=0", "train.eval_every=150",
               "train.eval_metric=accuracy", "decode.beam_size=1"]  # fmt: skip
# The beam search the table was first measured with (GNMT's penalty, α 0.6, end at the first K finished),
# kept so that every row is scored alike; attnkit's default search scores about 1 BLEU more.
MULTI30K_TRAIN = ["train.max_tokens=2048", "train.warmup=200", "train.lr=1.5e-3", "train.eval_every=90",
                  "train.valid_bleu_sentences=200", "decode.length_penalty=gnmt", "decode.alpha=0.6",
                  "decode.beam_stop=k-finished"]  # fmt: skip
TASKS = {
    "dates": (None, DATES_TRAIN,
              ["model.preset=tiny", "model.d_model=64", "model.d_ff=256", "model.h=4", "model.dropout=0"],
              ["model.arch=rnn", "model.d_embed=64", "model.d_hidden=128", "model.dropout=0"]),
    "multi30k": (ROOT / "configs" / "multi30k_de_en.yaml", MULTI30K_TRAIN, [],
                 ["model.arch=rnn", "model.preset=rnn-small", "model.dropout=0.3"]),
}  # fmt: skip


def learning_speed(run_dir: Path, task: str) -> str:
    """Dates: the step (and minute) validation first reached 99% exact match; Multi30k: its best BLEU."""
    rows = [
        row for row in csv.DictReader((run_dir / "metrics.csv").open(encoding="utf-8")) if row["valid_loss"]
    ]
    if task == "multi30k":
        return f"{max(float(row['valid_bleu']) for row in rows):.2f}"
    reached = [row for row in rows if float(row["valid_accuracy"]) >= 0.99]
    return (
        f"{int(reached[0]['step']):,} ({float(reached[0]['elapsed_s']) / 60:.1f} min)" if reached else "never"
    )


def run_variant(
    task: str, variant: str, minutes: float, data: str | None, runs: Path, plots: Path, overrides: list[str]
) -> dict:
    recipe, common, transformer, rnn = TASKS[task]
    settings = [*common, *(rnn if variant.startswith("rnn") else transformer), *VARIANTS[variant],
                f"train.max_minutes={minutes}", "train.max_epochs=0", "train.max_steps=0",
                *overrides]  # fmt: skip
    if data:
        settings.append(f"data.dir={data}")
    config = load_run_config(recipe, settings)
    run_dir = runs / task / variant
    began = time.perf_counter()
    trainer = Trainer(config, run_dir, overwrite=True, echo=lambda message: None)
    trainer.fit()
    trained = time.perf_counter() - began
    model, tokenizer, config = load_for_inference(run_dir)  # the best checkpoint by validation
    test = read_split(config.data, "test", config.train.seed)
    hypotheses = translate(model, tokenizer, test.src, config.decode)
    score = exact_match(hypotheses, test.tgt) * 100 if task == "dates" else bleu(hypotheses, test.tgt).score
    if variant != "rnn-none":
        plot = plots / f"{task}-{variant}.png"
        plot_translation_attention(model, tokenizer, test.src[0], hypotheses[0], plot, f"{variant} ({task})")
    return {"task": task, "variant": variant, "parameters": sum(p.numel() for p in model.parameters()),
            "steps": trainer.state.step, "minutes": round(trained / 60, 1), "score": round(score, 2),
            "learning": learning_speed(run_dir, task),
            "metric": "exact match %" if task == "dates" else "sacreBLEU"}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=[*TASKS, "all"], default="dates")
    parser.add_argument("--data", default=None, help="Multi30k's folder (for --task multi30k or all)")
    parser.add_argument("--minutes", type=float, default=2.0, help="training wall time per variant")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    parser.add_argument("--runs", type=Path, default=Path("runs/attention_variants"))
    parser.add_argument("--plots", type=Path, default=None, help="heat maps' folder (default: RUNS/plots)")
    parser.add_argument("overrides", nargs="*", help="section.field=value for every variant (experiments)")
    args = parser.parse_args()
    tasks = list(TASKS) if args.task == "all" else [args.task]
    if "multi30k" in tasks and not args.data:
        parser.error("--task multi30k needs --data (the folder with Multi30k's raw files)")
    variants = args.variants.split(",")
    for unknown in set(variants) - set(VARIANTS):
        parser.error(f"unknown variant {unknown!r}; choose from {', '.join(VARIANTS)}")
    args.plots = args.plots or args.runs / "plots"
    args.plots.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.minutes} minutes per variant "
          "(validation included); dropout, precision and batch as in each task's recipe")  # fmt: skip
    print("| task | variant | parameters | steps | minutes | test score | 99% valid at / best valid BLEU |\n"
          "|---|---|---|---|---|---|---|", flush=True)  # fmt: skip
    for task in tasks:
        for variant in variants:
            row = run_variant(task, variant, args.minutes, args.data, args.runs, args.plots, args.overrides)
            print(f"| {task} | {variant} | {row['parameters']:,} | {row['steps']:,} | {row['minutes']} | "
                  f"{row['score']:.2f} {row['metric']} | {row['learning']} |", flush=True)  # fmt: skip
            with (args.runs / "results.jsonl").open("a", encoding="utf-8") as results:
                results.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
