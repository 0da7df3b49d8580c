"""The ``attnkit`` command line: a thin layer over the Python API.

Errors a user can cause (``AttnkitError``) are printed as one line and exit with status 2.
"""

from __future__ import annotations

import time
from typing import Annotated

import torch
import typer

from attnkit.errors import AttnkitError
from attnkit.models import PRESETS, TransformerConfig, build_transformer

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


def _fail(error: AttnkitError) -> typer.Exit:
    typer.echo(f"attnkit: error: {error}", err=True)
    return typer.Exit(code=2)


@app.command()
def summary(
    preset: Annotated[str, typer.Option(help=f"Model preset: {', '.join(PRESETS)}.")] = "paper-base",
    vocab: Annotated[int, typer.Option(help="Shared source/target vocabulary size.")] = 37000,
    batch: Annotated[int, typer.Option(help="Sentences in the forward pass.")] = 2,
    length: Annotated[int, typer.Option(help="Tokens per sentence in the forward pass.")] = 16,
) -> None:
    """Build a model from a preset, print its parts and size, and time one forward pass on CPU."""
    try:
        config = TransformerConfig.from_preset(preset)
    except AttnkitError as error:
        raise _fail(error) from None
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


@app.callback()
def main() -> None:
    """attnkit: the Transformer of "Attention Is All You Need" and the attention family around it."""


if __name__ == "__main__":
    app()
