"""The ``attnkit`` command line: a thin layer over the Python API.

Errors a user can cause (``AttnkitError``) are printed as one line and exit with status 2.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import torch
import typer

from attnkit.errors import AttnkitError
from attnkit.models import PRESETS, TransformerConfig, build_transformer

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
EXTRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def one_line_errors(command: Callable) -> Callable:
    """Print a user error (AttnkitError) as one line on stderr and exit 2, instead of a traceback."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except AttnkitError as error:
            typer.echo(f"attnkit: error: {error}", err=True)
            raise typer.Exit(code=2) from None

    return run


def parse_overrides(args: list[str]) -> list[str]:
    """``--train.lr 5e-4`` and ``train.lr=5e-4`` both become ``train.lr=5e-4``."""
    overrides, i = [], 0
    while i < len(args):
        arg = args[i]
        if "=" in arg:
            overrides.append(arg.lstrip("-"))
            i += 1
        elif arg.startswith("--") and "." in arg and i + 1 < len(args):
            overrides.append(f"{arg[2:]}={args[i + 1]}")
            i += 2
        else:
            raise AttnkitError(f"unexpected argument {arg!r}; config overrides look like --train.lr 5e-4")
    return overrides


def _read_input(path: Path | None) -> list[str]:
    from attnkit.data.readers import read_lines

    if path is None:
        return [line.rstrip("\n") for line in sys.stdin]
    return read_lines(path)


@app.command()
@one_line_errors
def summary(
    preset: Annotated[str, typer.Option(help=f"Model preset: {', '.join(PRESETS)}.")] = "paper-base",
    vocab: Annotated[int, typer.Option(help="Shared source/target vocabulary size.")] = 37000,
    batch: Annotated[int, typer.Option(help="Sentences in the forward pass.")] = 2,
    length: Annotated[int, typer.Option(help="Tokens per sentence in the forward pass.")] = 16,
) -> None:
    """Build a model from a preset, print its parts and size, and time one forward pass on CPU."""
    config = TransformerConfig.from_preset(preset)
    torch.manual_seed(0)
    model = build_transformer(config, vocab).eval()
    typer.echo(f"attnkit EncoderDecoder, preset {preset!r}, shared vocabulary {vocab}")
    typer.echo("  " + ", ".join(f"{k}={v}" for k, v in config.to_dict().items()))
    for name in ("src_embed", "src_pos", "encoder", "tgt_embed", "tgt_pos", "decoder", "generator"):
        child = getattr(model, name)
        count = sum(p.numel() for p in child.parameters())
        typer.echo(
            f"  {name:<10} {count:>14,} parameters" + ("  (shared)" if _is_shared(model, name) else "")
        )
    total = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    typer.echo(f"  {'total':<10} {total:>14,} parameters ({total / 1e6:.1f}M)")
    src = torch.randint(4, vocab, (batch, length))
    tgt = torch.randint(4, vocab, (batch, length))
    with torch.inference_mode():
        began = time.perf_counter()
        logits = model(src, tgt)
        seconds = time.perf_counter() - began
    typer.echo(
        f"forward pass: src {tuple(src.shape)}, tgt {tuple(tgt.shape)} -> logits {tuple(logits.shape)} "
        f"in {seconds * 1000:.0f} ms"
    )


def _is_shared(model: torch.nn.Module, name: str) -> bool:
    """Whether this child's weight is also another child's (the paper's shared embeddings)."""
    if name == "tgt_embed":
        return model.tgt_embed is model.src_embed
    if name == "generator":
        return model.generator.proj.weight is model.tgt_embed.lut.weight
    return False


@app.command()
@one_line_errors
def quickstart(
    out: Annotated[Path, typer.Option(help="Run directory.")] = Path("runs/quickstart"),
    steps: Annotated[int, typer.Option(help="Training steps.")] = 1500,
    minutes: Annotated[float, typer.Option(help="Time limit for training (stops earlier if reached).")] = 2.5,
) -> None:
    """Train on generated dates -> ISO dates, report held-out accuracy, save an attention heat map."""
    from attnkit.quickstart import run_quickstart

    run_quickstart(out, steps, minutes, echo=typer.echo)


@app.command(context_settings=EXTRA_ARGS)
@one_line_errors
def train(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Argument(help="YAML recipe (configs/*.yaml).")] = None,
    run: Annotated[
        Path | None, typer.Option("--run-dir", help="Run directory for checkpoints and logs.")
    ] = None,
    resume: Annotated[Path | None, typer.Option(help="Continue the run in this directory.")] = None,
    data: Annotated[Path | None, typer.Option(help="Data directory (sets data.dir).")] = None,
) -> None:
    """Train a model; extra ``--section.field value`` arguments override the recipe."""
    from attnkit.config import load_run_config
    from attnkit.train.loop import Trainer

    extra = ctx.args
    if config is not None and "=" in config.name and not config.exists():  # an override, not a file
        config, extra = None, [str(config), *extra]
    overrides = parse_overrides(extra) + ([f"data.dir={data}"] if data else [])
    if resume is not None:  # the run's own config (config.json is YAML too), plus any overrides
        from attnkit.train.checkpoint import resolve_checkpoint

        config = config or resolve_checkpoint(resume, prefer="last") / "config.json"
        run = resume
    if run is None:
        raise AttnkitError("give --run-dir DIR for a new run, or --resume DIR to continue one")
    run_config = load_run_config(config, overrides)
    scores = Trainer(run_config, run, resume=resume is not None, echo=typer.echo).fit()
    typer.echo("final validation: " + ", ".join(f"{k} {v:.4g}" for k, v in scores.items()))


@app.command()
@one_line_errors
def translate(
    ckpt: Annotated[Path, typer.Option(help="Checkpoint folder or run directory (its best checkpoint).")],
    beam: Annotated[
        int | None, typer.Option(help="Beam size; 1 = greedy. Default: the run's decode.beam_size.")
    ] = None,
    input: Annotated[Path | None, typer.Option("-i", "--input", help="Source file (default: stdin).")] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Output file (default: stdout).")
    ] = None,
) -> None:
    """Translate one sentence per line."""
    from attnkit.decode.translate import translate as translate_texts
    from attnkit.train.checkpoint import load_for_inference
    from attnkit.train.distributed import resolve_device

    device = resolve_device()
    model, tokenizer, config = load_for_inference(ckpt, device)
    hypotheses = translate_texts(
        model, tokenizer, _read_input(input), config.decode, beam_size=beam, device=device
    )
    text = "".join(h + "\n" for h in hypotheses)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")


@app.command()
@one_line_errors
def evaluate(
    ckpt: Annotated[Path, typer.Option(help="Checkpoint folder or run directory.")],
    src: Annotated[Path, typer.Option(help="Source sentences, one per line (.gz allowed).")],
    ref: Annotated[Path, typer.Option(help="Reference translations, aligned with --src.")],
    beam: Annotated[int | None, typer.Option(help="Beam size; 1 = greedy.")] = None,
) -> None:
    """Translate --src and print sacreBLEU BLEU and chrF against --ref, with their signatures."""
    from attnkit.data.readers import read_parallel
    from attnkit.decode.translate import translate as translate_texts
    from attnkit.metrics import bleu, chrf
    from attnkit.train.checkpoint import load_for_inference
    from attnkit.train.distributed import resolve_device

    pairs = read_parallel(src, ref)
    device = resolve_device()
    model, tokenizer, config = load_for_inference(ckpt, device)
    began = time.perf_counter()
    hypotheses = translate_texts(model, tokenizer, pairs.src, config.decode, beam_size=beam, device=device)
    seconds = time.perf_counter() - began
    typer.echo(str(bleu(hypotheses, pairs.tgt)))
    typer.echo(str(chrf(hypotheses, pairs.tgt)))
    typer.echo(f"{len(pairs)} sentences in {seconds:.1f} s")


@app.command()
@one_line_errors
def average(
    run: Annotated[Path, typer.Option("--run-dir", help="Run directory whose checkpoints to average.")],
    last: Annotated[int, typer.Option(help="How many of the latest checkpoints.")] = 5,
    out: Annotated[
        Path | None, typer.Option(help="Output checkpoint folder (default: RUN/averaged).")
    ] = None,
) -> None:
    """Average the weights of the last N checkpoints into a new checkpoint folder."""
    from attnkit.train.checkpoint import average_checkpoints, list_checkpoints

    checkpoints = list_checkpoints(run)[-last:]
    written = average_checkpoints(checkpoints, out or run / "averaged")
    typer.echo(
        f"averaged {len(checkpoints)} checkpoints ({', '.join(c.name for c in checkpoints)}) into {written}"
    )


@app.callback()
def main() -> None:
    """attnkit: the Transformer of "Attention Is All You Need" and the attention family around it."""


if __name__ == "__main__":
    app()
