"""``attnkit quickstart``: train a small Transformer on a generated task in about two minutes on a CPU.

The task (data/synthetic.py ``dates``) turns human-written dates into ISO dates, so it needs no
download. The recipe below is the paper's model, only smaller (2+2 layers, d_model=64) and at character
level: 1,500 steps (about two minutes on two CPU cores), then the last three checkpoints are averaged
as in the paper (§6.1), which reaches ≥ 99% exact match on held-out dates. Training is bound by its
steps and seed, not by a clock, so a slower or busier machine takes longer but trains as much and
reports the same kind of result (pinned to one core: about 100 s). Each quickstart starts
afresh: an earlier quickstart's checkpoints in the same folder are deleted first, so that only this
run's checkpoints are averaged. Nothing else is ever deleted: a folder holding another run (or a
quickstart's from before checkpoints recorded what made them) is refused unless ``overwrite``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from attnkit.checkpoint.average import average_checkpoints
from attnkit.checkpoint.folder import list_checkpoints
from attnkit.checkpoint.run_dir import earlier_run
from attnkit.config import RunConfig
from attnkit.decode.translate import translate
from attnkit.errors import AttnkitError
from attnkit.folders import MadeBy, made_by
from attnkit.loading import load_for_inference
from attnkit.metrics import exact_match
from attnkit.tasks.translation import read_split
from attnkit.train.loop import Trainer
from attnkit.viz.attention import plot_translation_attention

RECIPE = {
    "model": {"preset": "tiny", "d_model": 64, "d_ff": 256, "h": 4, "dropout": 0.0},
    "data": {"task": "dates", "tokenizer": "char", "n_train": 50000, "n_valid": 500},
    "train": {"max_tokens": 2000, "schedule": "inverse_sqrt", "lr": 0.002, "warmup": 200, "clip_norm": 1.0,
              "label_smoothing": 0.0, "eval_every": 150, "eval_metric": "accuracy", "max_steps": 1500,
              "seed": 1, "precision": "fp32"},
    "decode": {"beam_size": 1, "precision": "fp32", "steps": "eager"},
}  # fmt: skip
# float32 on every machine, though bf16 would train faster where the CPU has the units: the result must
# not depend on the machine (and a model this small gains little from bf16); the model's own decoding
# steps, never compiled ones, whatever an earlier run left in the cache


COMMAND = "attnkit quickstart"  # what made its checkpoints, as each records (folders.py)


def run_quickstart(
    out: Path, max_steps: int | None = None, echo: Callable[[str], None] = print, overwrite: bool = False
) -> float:
    """Train, average, report held-out exact match and examples, plot attention; returns the accuracy.
    ``overwrite``: replace a run in ``out`` that is not an earlier quickstart's (deleted first)."""
    config = RunConfig.from_dict(RECIPE, "quickstart recipe")
    config.train.max_steps = max_steps or config.train.max_steps
    echo(
        f"training a {config.model.encoder_layers}+{config.model.decoder_layers}-layer Transformer on "
        f"'{config.data.task}' for {config.train.max_steps} steps in {out}"
    )
    if not overwrite:
        _refuse_other_runs(out)
    Trainer(config, out, overwrite=True, echo=echo, command=COMMAND).fit()
    maker = MadeBy.of(COMMAND, out)
    averaged = average_checkpoints(list_checkpoints(out)[-3:], out / "averaged", maker=maker, overwrite=True)
    model, tokenizer, config = load_for_inference(averaged)
    test = read_split(config.data, "test", config.train.seed)  # never seen in training or validation
    hypotheses = translate(model, tokenizer, test.src, config.decode, beam_size=1)
    accuracy = exact_match(hypotheses, test.tgt)
    echo(
        f"held-out exact match of the average of the last 3 checkpoints: {accuracy:.1%} of {len(test)} dates"
    )
    for source, hypothesis, reference in list(zip(test.src, hypotheses, test.tgt, strict=True))[:5]:
        echo(
            f"  {source!r:>32} -> {hypothesis!r}"
            + ("" if hypothesis == reference else f"  (expected {reference!r})")
        )
    plot = out / "attention.png"
    plot_translation_attention(model, tokenizer, test.src[0], hypotheses[0], plot)
    echo(f"attention heat map of the first example: {plot}")
    return accuracy


def _refuse_other_runs(out: Path) -> None:
    """A quickstart deletes an earlier quickstart's run in ``out``, never another run: one whose
    checkpoints do not all record that a quickstart in ``out`` made them is refused in one line."""
    earlier = earlier_run(out)
    checkpoints = list_checkpoints(out)
    ours = MadeBy.of(COMMAND, out)
    if earlier and not (checkpoints and all(made_by(c) == ours for c in checkpoints)):
        held = ", ".join(p.name for p in earlier[:3])
        raise AttnkitError(
            f"{out} holds a run ({held}) that is not an earlier quickstart's, which a quickstart would "
            "delete; give --out a new folder, or pass --overwrite to replace it"
        )
