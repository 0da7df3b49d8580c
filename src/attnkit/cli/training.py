"""``attnkit summary``, ``quickstart``, ``train`` and ``average``: building, training and averaging models."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import torch
import typer

from attnkit.cli.shared import EXTRA_ARGS, Overwrite, app, at_least, one_line_errors, recipe_and_overrides
from attnkit.cpu import allocator
from attnkit.errors import AttnkitError
from attnkit.models import ARCHITECTURES, PRESETS, archs, build_model, from_preset


@app.command()
@one_line_errors
def summary(
    preset: Annotated[str, typer.Option(help=f"Model preset: {', '.join(PRESETS)}.")] = "paper-base",
    vocab: Annotated[int, typer.Option(help="Vocabulary size (shared by source and target).")] = 37000,
    batch: Annotated[int, typer.Option(help="Sequences in the forward pass.")] = 2,
    length: Annotated[int, typer.Option(help="Tokens per sequence in the forward pass.")] = 16,
) -> None:
    """Build a model from a preset, print its parts and size, and time one forward pass on CPU (saying
    its threads and memory allocator)."""
    at_least("--vocab", vocab, 5)
    at_least("--batch", batch, 1)
    at_least("--length", length, 1)
    config = from_preset(preset)
    torch.manual_seed(0)
    record = ARCHITECTURES[config.arch]
    images = record.reads == "images"  # they read pixels
    model = build_model(config, vocab if record.has_vocabulary else None).eval()
    reads = f"{config.image_size}×{config.image_size} images" if images else f"vocabulary {vocab}"
    if record.reads == "audio":
        reads = f"{config.n_mels} log-mel features a frame, vocabulary {vocab}"
    typer.echo(f"attnkit {type(model).__name__} ({config.arch}), preset {preset!r}, {reads}")
    typer.echo("  " + ", ".join(f"{k}={v}" for k, v in config.to_dict().items()))
    seen: set[int] = set()
    for name, child in model.named_modules(remove_duplicate=False):
        if not name or "." in name:  # the model's direct parts only, a shared one under each of its names
            continue
        parameters = list(child.parameters())
        shared = any(id(p) in seen for p in parameters)
        seen.update(id(p) for p in parameters)
        count = sum(p.numel() for p in parameters)
        typer.echo(f"  {name:<10} {count:>14,} parameters" + ("  (shared)" if shared else ""))
    total = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    typer.echo(f"  {'total':<10} {total:>14,} parameters ({total / 1e6:.1f}M)")
    n_inputs = 2 if config.arch in archs(using="translate") else 1  # (source, target) or the tokens
    inputs = [torch.randint(1, vocab, (batch, length)) for _ in range(n_inputs)]  # any id but padding (0)
    if images:  # a captioner reads the caption so far too
        pixels = torch.rand(batch, 1, config.image_size, config.image_size)
        inputs = [pixels, *inputs[: record.has_vocabulary]]
    if record.reads == "audio":  # a second of frames, and the transcript so far
        inputs = [torch.randn(batch, 100, config.n_mels), inputs[0]]
    with torch.inference_mode():
        began = time.perf_counter()
        logits = model(*inputs)
        seconds = time.perf_counter() - began
    shapes = ", ".join(str(tuple(x.shape)) for x in inputs)
    what = "hidden states" if getattr(config, "head", "") == "none" else "logits"
    on = f"{torch.get_num_threads()} threads, allocator: {allocator.running()}"
    typer.echo(f"forward pass: {shapes} -> {what} {tuple(logits.shape)} in {seconds * 1000:.0f} ms ({on})")


@app.command()
@one_line_errors
def quickstart(
    out: Annotated[Path, typer.Option(help="Run directory.")] = Path("runs/quickstart"),
    steps: Annotated[int, typer.Option(help="Training steps.")] = 1500,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a run in --out that is not an earlier quickstart's.")
    ] = False,
) -> None:
    """Train on generated dates -> ISO dates, report held-out accuracy, save an attention heat map.

    Training runs a fixed number of steps from a fixed seed, so any machine trains as much (about two
    minutes on 2 cores; a progress bar shows the time left). Each quickstart starts afresh: an earlier
    quickstart in the same --out folder is replaced, and nothing else is deleted (a folder holding
    another run is refused unless --overwrite)."""
    from attnkit.quickstart import run_quickstart

    at_least("--steps", steps, 1)
    run_quickstart(out, steps, echo=typer.echo, overwrite=overwrite)


@app.command(context_settings=EXTRA_ARGS)
@one_line_errors
def prepare(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Argument(help="YAML recipe (configs/*.yaml).")] = None,
    data: Annotated[Path | None, typer.Option(help="Data directory (sets data.dir).")] = None,
) -> None:
    """Encode a recipe's training data once into a token store (parallel files, a summariser's JSON
    Lines, a language model's text, a classifier's or masked-LM's sentences), which every later run of
    the same files and settings (each process of it too) maps instead of reading and encoding them
    again; ``attnkit train`` does the same on first use. Prints where the store is. The store is kept
    under ``data.store`` (default: $XDG_CACHE_HOME/attnkit/stores)."""
    from attnkit.config import load_run_config
    from attnkit.task_records import TASK_RECORDS
    from attnkit.tasks import task_class

    config, overrides = recipe_and_overrides(config, ctx.args, data)
    run_config = load_run_config(config, overrides)
    task = TASK_RECORDS[run_config.data.task]
    if not task.store:
        kinds: dict[str, list[str]] = {}  # what is encoded -> the tasks whose data it is
        for record in TASK_RECORDS.values():
            if record.store:
                kinds.setdefault(record.store, []).append(record.name)
        encoded = [f"{what} ({', '.join(names)})" for what, names in kinds.items()]
        raise AttnkitError(
            f"data.task={task.name}: attnkit prepare encodes {', '.join(encoded[:-1])} and {encoded[-1]}; "
            "generated tasks make their data as they train"
        )
    run_config.data.check_files_given()
    task_class(task.name).prepare_store(run_config, typer.echo)


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
    overwrite: Annotated[
        bool, typer.Option(help="Delete an earlier run's checkpoints in --run-dir and start afresh.")
    ] = False,
) -> None:
    """Train a model; extra ``--section.field value`` arguments override the recipe.

    A new run needs a --run-dir without an earlier run in it: continue that one with --resume, or
    replace it with --overwrite."""
    from attnkit.config import load_run_config
    from attnkit.train.loop import Trainer

    config, overrides = recipe_and_overrides(config, ctx.args, data)
    if resume is not None:  # the run's own config (config.json is YAML too), plus any overrides
        from attnkit.checkpoint.folder import resolve_checkpoint

        if run is not None and run.resolve() != resume.resolve():
            raise AttnkitError(
                f"--run-dir {run} and --resume {resume} differ: --resume DIR alone continues DIR"
            )
        if overwrite:
            raise AttnkitError("--resume continues a run and --overwrite replaces it: give one of them")
        config = config or resolve_checkpoint(resume, prefer="last") / "config.json"
        run = resume
    if run is None:
        raise AttnkitError("give --run-dir DIR for a new run, or --resume DIR to continue one")
    run_config = load_run_config(config, overrides)
    trainer = Trainer(run_config, run, resume=resume is not None, overwrite=overwrite, echo=typer.echo)
    try:
        scores = trainer.fit()
    except KeyboardInterrupt:
        saved = (run / "last").read_text(encoding="utf-8").strip() if (run / "last").is_file() else None
        where = f"the last checkpoint is {run / saved}; continue with: attnkit train --resume {run}"
        message = where if saved else "no checkpoint was written yet"
        typer.echo(f"attnkit: interrupted at step {trainer.state.step}; {message}", err=True)
        raise typer.Exit(code=130) from None
    if trainer.world.is_main and scores:  # one line, not one per process
        typer.echo("final validation: " + ", ".join(f"{k} {v:.4g}" for k, v in scores.items()))


@app.command()
@one_line_errors
def average(
    run: Annotated[Path, typer.Option("--run-dir", help="Run directory whose checkpoints to average.")],
    last: Annotated[int, typer.Option(help="How many of the latest checkpoints.")] = 5,
    out: Annotated[
        Path | None, typer.Option(help="Output checkpoint folder (default: RUN/averaged).")
    ] = None,
    overwrite: Overwrite = False,
) -> None:
    """Average the weights of the last N checkpoints into a new checkpoint folder.

    Averaging the same run again replaces its earlier average; any other folder (a checkpoint, another
    run's average, your own files) is refused unless --overwrite. The folder records what made it
    (made_by.json)."""
    from attnkit.checkpoint.average import average_checkpoints
    from attnkit.checkpoint.folder import list_checkpoints
    from attnkit.folders import MadeBy

    at_least("--last", last, 1)
    if not run.is_dir():
        raise AttnkitError(f"{run}: no such run directory")
    available = list_checkpoints(run)
    if not available:
        raise AttnkitError(f"{run}: no checkpoints to average (expected step-* folders)")
    checkpoints = available[-last:]
    maker = MadeBy.of("attnkit average", run)
    written = average_checkpoints(checkpoints, out or run / "averaged", maker=maker, overwrite=overwrite)
    fewer = f" (only {len(available)} exist)" if len(available) < last else ""
    typer.echo(
        f"averaged {len(checkpoints)} checkpoints{fewer} ({', '.join(c.name for c in checkpoints)}) "
        f"into {written}"
    )


@app.command("distill-draft")
@one_line_errors
def distill_draft(
    ckpt: Annotated[Path, typer.Option(help="Checkpoint folder or run directory (its best checkpoint).")],
    src: Annotated[
        Path | None,
        typer.Option(
            help="Sources to learn from, one per line (default: the run's training sources, "
            "data.train's first file, or a summariser's JSON Lines); a GPT's: a text to cut prompts from "
            "(default: its training text)."
        ),
    ] = None,
    minutes: Annotated[float, typer.Option(help="How long to train the draft for.")] = 5.0,
    batch_size: Annotated[int, typer.Option(help="Sources (a GPT's prompts) a step.")] = 64,
    seed: Annotated[int, typer.Option(help="Seed of the draft's order of sources and dropout.")] = 1,
    temperature: Annotated[
        float,
        typer.Option(
            help="A GPT's draft for speculative sampling at this temperature: it learns the model's "
            "distributions on its samples (KL divergence), not its greedy tokens (0)."
        ),
    ] = 0.0,
) -> None:
    """Teach a translation model's (or a GPT's) one-layer draft decoder to guess its greedy outputs, and
    save it in the checkpoint (draft.safetensors) for decode.speculative=shallow.

    The draft shares the model's encoder, embeddings and output layer and learns its one layer from
    the model's own greedy translations of the sources (sequence-level distillation), for --minutes;
    a GPT's, from prompts cut from a text and the model's greedy continuations of them. It says how
    often the draft guesses the model's next token on 200 held-out sources (prompts), before and
    after: the higher, the more tokens a speculative step takes. A draft changes no output, only the
    time it takes (translate, evaluate, generate --temperature 0 with decode.speculative=shallow).

    With --temperature T, a GPT's draft is made for generation at that temperature (speculative
    sampling): it learns the model's whole distribution at each position of the model's samples, and
    the share it states is how often its guesses would be kept."""
    from attnkit.checkpoint.draft_file import write_draft
    from attnkit.checkpoint.folder import resolve_checkpoint
    from attnkit.cli.shared import progress_bar
    from attnkit.loading import load_for_inference
    from attnkit.models.config import DecoderModelConfig, TransformerConfig

    at_least("--minutes", minutes, 0.01)
    at_least("--batch-size", batch_size, 1)
    at_least("--temperature", temperature, 0.0)
    checkpoint = resolve_checkpoint(ckpt)
    arch = (TransformerConfig.ARCH, DecoderModelConfig.ARCH)
    model, tokenizer, config = load_for_inference(checkpoint, "cpu", arch=arch, pack=False)
    # what it learns from, read (and refused in one line) before the progress bar starts
    if config.model.arch == DecoderModelConfig.ARCH:
        teach = _teaching_gpt(model, tokenizer, config, src, minutes, batch_size, seed, temperature)
    elif temperature > 0:
        raise AttnkitError("--temperature: drafts for sampling are a GPT's (a translation is searched)")
    else:
        teach = _teaching(model, tokenizer, config, src, minutes, batch_size, seed)
    with progress_bar() as bar:
        made = teach(bar.update)
    about = {
        "made_by": "attnkit distill-draft",
        "sentences": str(made.sentences),
        "minutes": f"{made.seconds / 60:.2f}",
        "agreement": f"{made.agreement_after:.4f}",
        **({"temperature": f"{temperature:g}"} if temperature > 0 else {}),
    }
    path = write_draft(checkpoint, made.draft, about)
    guesses = (
        f"its guesses would be kept {made.agreement_after:.1%} of the time at temperature {temperature:g}"
        if temperature > 0
        else f"it guesses {made.agreement_after:.1%} of the model's greedy tokens"
    )
    agreed = (
        f"{guesses} on {made.held_out_tokens:,} held-out tokens (a copy of its first layer: "
        f"{made.agreement_before:.1%}); "
        if made.held_out_tokens
        else ""
    )
    learnt = "continuations" if config.model.arch == DecoderModelConfig.ARCH else "translations"
    typer.echo(
        f"draft decoder saved to {path}: {agreed}learnt from {made.sentences:,} {learnt} in "
        f"{made.steps:,} steps, {made.seconds / 60:.1f} min"
    )


def _teaching(model, tokenizer, config, src: Path | None, minutes, batch_size, seed) -> Callable:
    """How a translation model's draft is taught, ``teach(progress)``: on the greedy translations of
    ``src``'s lines or the run's training sources."""
    from attnkit.decode.search import Search
    from attnkit.decode.starts import encode_sources
    from attnkit.tasks import task_of
    from attnkit.train.distill_draft import distill_draft

    texts = [text for text in _draft_sources(config, src) if text.strip()]
    if len(texts) < 2:
        raise AttnkitError(f"{src or 'the run’s training sources'}: too few sentences to learn a draft from")
    limit = config.data.source_limit if task_of(config).cuts_sources else None  # as in training
    sources = encode_sources(tokenizer, texts, model.config.max_len, limit)
    search = Search.of(config.decode, beam_size=1, max_output_len=model.config.max_len)
    return lambda progress: distill_draft(
        model, sources, tokenizer.specials, search, minutes=minutes, batch_size=batch_size, seed=seed,
        progress=progress,
    )  # fmt: skip


def _teaching_gpt(
    model, tokenizer, config, src: Path | None, minutes, batch_size, seed, temperature
) -> Callable:
    """How a GPT's draft is taught, ``teach(progress)``: on prompts cut from ``src``'s text or the run's
    training text (continued greedily, or sampled at ``temperature``)."""
    from attnkit.data.readers import read_text
    from attnkit.train.distill_draft import distill_causal_draft

    if src is None and not config.data.train:
        raise AttnkitError("the run names no training text (data.train): give --src FILE, a text")
    text = read_text(src if src is not None else Path(config.data.dir) / config.data.train[0])
    ids = tokenizer.encode(text)
    needed = 2 * model.config.max_len
    if len(ids) < needed:
        what = src or "the run’s training text"
        raise AttnkitError(f"{what}: {len(ids)} tokens, too few to learn a draft from (at least {needed})")
    return lambda progress: distill_causal_draft(
        model, ids, tokenizer.specials, minutes=minutes, batch_size=batch_size, seed=seed, progress=progress,
        temperature=temperature,
    )  # fmt: skip


def _draft_sources(config, src: Path | None) -> list[str]:
    """The sources a draft learns from: ``src``'s lines, or the run's own training sources."""
    from attnkit.data.readers import read_jsonl, read_lines

    if src is not None:
        return read_lines(src)
    data = config.data
    if data.task == "parallel" and data.train:
        return read_lines(Path(data.dir) / data.train[0])
    if data.task == "summarise" and data.train:
        return read_jsonl(Path(data.dir) / data.train[0], data.fields[0]).src
    raise AttnkitError(
        f"the run's data (data.task={data.task}) is not read from files: give --src FILE, sources one "
        "per line"
    )
