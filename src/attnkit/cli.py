"""The ``attnkit`` command line: a thin layer over the Python API.

Errors a user can cause (``AttnkitError``, and typer's usage errors such as a missing option) are printed
as one line and exit with status 2. Every option's value is checked before any work starts, and every
output path is checked to be writable before hours of decoding, not after.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import torch
import typer

from attnkit.config import IMAGE_ARCHS
from attnkit.errors import AttnkitError
from attnkit.models import ARCHITECTURES, PRESETS, archs, build_model, from_preset
from attnkit.utf8 import command_line_text, native_path, use_utf8_streams

if TYPE_CHECKING:
    from attnkit.decode.ct2 import CTranslate2Translator

T = TypeVar("T")
app = typer.Typer(add_completion=False, no_args_is_help=True)  # help: describe() below
EXTRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def _as_sent(text: str | None) -> str | None:
    """A text option as the UTF-8 the terminal sent, whatever the locale (utf8.py)."""
    return None if text is None else command_line_text(text)


def _dash_is_standard_stream(path: Path | None) -> Path | None:
    """``-o -`` means stdout, as for most command-line tools (``-i -`` stdin: ``iter_lines``)."""
    return None if path is not None and str(path) == "-" else path


OutputFile = Annotated[
    Path | None,
    typer.Option("-o", "--output", help="Output file (default: stdout).", callback=_dash_is_standard_stream),
]
Int8 = Annotated[
    bool, typer.Option("--int8", help="CPU: int8 weights and activations in the linear maps (faster).")
]
Overwrite = Annotated[
    bool,
    typer.Option(
        "--overwrite",
        help="Replace --out whatever it holds (a checkpoint, a run, your own files). Without it, --out "
        "must be new, empty, or this command's own earlier output from the same source.",
    ),
]
Engine = Annotated[
    str, typer.Option(help="attnkit, or ctranslate2 for a folder from 'attnkit export --to ctranslate2'.")
]


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


def main() -> None:
    """The ``attnkit`` program: runs :data:`app`, printing typer's usage errors as one line too."""
    use_utf8_streams()
    if len(sys.argv) <= 1:
        sys.argv.append("--help")
    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        sys.exit(130)
    except typer.TyperException as error:  # a usage error: missing option, bad value, unknown command
        context = getattr(error, "ctx", None)
        hint = f" (try '{context.command_path} --help')" if context is not None else ""
        typer.echo(f"attnkit: error: {error.format_message()}{hint}", err=True)
        sys.exit(getattr(error, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)


def at_least(option: str, value: float | None, low: float) -> None:
    """A one-line error unless the option's value is at least ``low`` (None = not given)."""
    if value is not None and value < low:
        raise AttnkitError(f"{option} must be at least {low}; got {value}")


def writable_file(path: Path) -> Path:
    """``path`` if a file can be written there; checked before the work whose result it will hold."""
    if path.is_dir():
        raise AttnkitError(f"{path}: is a folder; give a file name")
    if not path.parent.is_dir():
        raise AttnkitError(f"{path}: the folder {path.parent} does not exist")
    try:
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as error:
        raise AttnkitError(f"{path}: cannot write there ({error.strerror or error})") from None
    return path


def parse_overrides(args: list[str], example: str = "--train.lr 5e-4") -> list[str]:
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
            raise AttnkitError(f"unexpected argument {arg!r}; config overrides look like {example}")
    return overrides


def decode_overrides(ctx: typer.Context, streams: int | None = None) -> list[str]:
    """A decoding command's extra ``decode.field=value`` arguments (``--decode.alpha 0.6`` too), with
    ``--streams`` as ``decode.streams``: settings that change how a trained model decodes."""
    overrides = parse_overrides(ctx.args, example="decode.alpha=0.6")
    return overrides + ([f"decode.streams={streams}"] if streams is not None else [])


def _read_input(path: Path | None) -> list[str]:
    """Lines from a file or stdin; empty input is fine (empty in, empty out)."""
    from attnkit.data.readers import iter_lines

    return list(iter_lines(path))


def _write_output(output: Path | None, text: str) -> None:
    """``text`` to stdout, or to the file ``output`` written atomically (all of it or nothing)."""
    from attnkit.atomic import write_text_atomic

    if output is None:
        sys.stdout.write(text)
    else:
        write_text_atomic(output, text)


def _stream(text: str) -> None:
    """Show ``text`` on stdout now, not when the buffer fills."""
    sys.stdout.write(text)
    sys.stdout.flush()


def _note(message: str) -> None:
    typer.echo(f"attnkit: note: {message}", err=True)


@app.command()
@one_line_errors
def summary(
    preset: Annotated[str, typer.Option(help=f"Model preset: {', '.join(PRESETS)}.")] = "paper-base",
    vocab: Annotated[int, typer.Option(help="Vocabulary size (shared by source and target).")] = 37000,
    batch: Annotated[int, typer.Option(help="Sequences in the forward pass.")] = 2,
    length: Annotated[int, typer.Option(help="Tokens per sequence in the forward pass.")] = 16,
) -> None:
    """Build a model from a preset, print its parts and size, and time one forward pass on CPU."""
    at_least("--vocab", vocab, 5)
    at_least("--batch", batch, 1)
    at_least("--length", length, 1)
    config = from_preset(preset)
    torch.manual_seed(0)
    images = config.arch in IMAGE_ARCHS  # they read pixels: no vocabulary
    model = build_model(config, None if images else vocab).eval()
    reads = f"{config.image_size}×{config.image_size} images" if images else f"vocabulary {vocab}"
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
    if images:
        inputs = [torch.rand(batch, 1, config.image_size, config.image_size)]
    with torch.inference_mode():
        began = time.perf_counter()
        logits = model(*inputs)
        seconds = time.perf_counter() - began
    shapes = ", ".join(str(tuple(x.shape)) for x in inputs)
    what = "hidden states" if getattr(config, "head", "") == "none" else "logits"
    typer.echo(f"forward pass: {shapes} -> {what} {tuple(logits.shape)} in {seconds * 1000:.0f} ms")


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

    extra = ctx.args
    if config is not None and "=" in config.name and not config.exists():  # an override, not a file
        config, extra = None, [str(config), *extra]
    overrides = parse_overrides(extra) + ([f"data.dir={data}"] if data else [])
    if resume is not None:  # the run's own config (config.json is YAML too), plus any overrides
        from attnkit.checkpoint import resolve_checkpoint

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
        typer.echo(f"attnkit: interrupted at step {trainer.step}; {message}", err=True)
        raise typer.Exit(code=130) from None
    if trainer.world.is_main:  # one line, not one per process
        typer.echo("final validation: " + ", ".join(f"{k} {v:.4g}" for k, v in scores.items()))


@app.command(context_settings=EXTRA_ARGS)
@one_line_errors
def translate(
    ctx: typer.Context,
    ckpt: Annotated[Path, typer.Option(help="Checkpoint folder or run directory (its best checkpoint).")],
    beam: Annotated[
        int | None, typer.Option(help="Beam size; 1 = greedy. Default: the run's decode.beam_size.")
    ] = None,
    input: Annotated[Path | None, typer.Option("-i", "--input", help="Source file (default: stdin).")] = None,
    output: OutputFile = None,
    engine: Engine = "attnkit",
    int8: Int8 = False,
    streams: Annotated[
        int | None,
        typer.Option(
            help="CPU: batches translated at a time, each on its share of the threads; 0 = one "
            "per thread. Default: the run's decode.streams."
        ),
    ] = None,
    n_best: Annotated[
        int,
        typer.Option(
            help="Write each line's N best translations with their scores, 'LINE ||| TRANSLATION ||| "
            "SCORE' (LINE from 0, best first; beam search, --beam at least N; the score is log P / "
            "length^alpha; CTranslate2 scores its own way); 0 = the best alone."
        ),
    ] = 0,
) -> None:
    """Translate one sentence per line (an empty line gives an empty line).

    The input is read and translated a part at a time (50,000 lines, each part's batches made of
    sentences of similar length), so that an input of any size fits in memory; stdout gets each part's
    lines as they are done, an output file all of them at the end. A progress bar shows on a terminal.
    Extra ``decode.field=value`` arguments change the run's decoding settings, e.g. ``decode.alpha=0.6``
    (an α chosen on validation data) or ``decode.batch_size=128``."""
    from attnkit.decode.translate import translate as translate_texts
    from attnkit.decode.translate import translate_n_best
    from attnkit.train.distributed import resolve_device

    at_least("--beam", beam, 1)
    at_least("--streams", streams, 0)
    at_least("--n-best", n_best, 0)
    overrides = decode_overrides(ctx, streams)
    check_engine(engine, int8)
    if output is not None:
        writable_file(output)
    if engine == "ctranslate2":
        ct2 = _ctranslate2(ckpt, overrides)
        _check_n_best(n_best, beam or ct2.decode.beam_size)

        def translate_part(texts: list[str], first: int, progress: Callable[[int], None]) -> list[str]:
            if not n_best:
                return ct2.translate(texts, beam, progress)
            return _n_best_lines(ct2.translate_n_best(texts, n_best, beam, progress), first)

        _by_parts(input, output, translate_part)
        return
    device = resolve_device()
    model, tokenizer, config = _load_translator(ckpt, device, overrides, int8)
    _check_n_best(n_best, beam or config.decode.beam_size)
    source_limit = config.data.source_limit if config.data.task == "summarise" else None  # as in training
    settings = dict(beam_size=beam, device=device, warn=_note, source_limit=source_limit)

    def translate_part(texts: list[str], first: int, progress: Callable[[int], None]) -> list[str]:
        if not n_best:
            return translate_texts(model, tokenizer, texts, config.decode, progress=progress,
                                   first_line=first, **settings)  # fmt: skip
        found = translate_n_best(model, tokenizer, texts, config.decode, n_best, progress=progress,
                                 first_line=first, **settings)  # fmt: skip
        return _n_best_lines(found, first)

    _by_parts(input, output, translate_part)


def _check_n_best(n_best: int, beam: int) -> None:
    if n_best > beam:
        raise AttnkitError(f"--n-best {n_best} needs a beam at least as wide: give --beam {n_best} or more")


def _n_best_lines(found: list[list[tuple[str, float]]], first: int) -> list[str]:
    """``LINE ||| TRANSLATION ||| SCORE`` for each hypothesis of each line (LINE from 0; ``first`` is the
    number of the part's first line, from 1)."""
    return [f"{first - 1 + i} ||| {text} ||| {score:.4f}" for i, best in enumerate(found)
            for text, score in best]  # fmt: skip


PART_LINES = 50_000  # lines translate and generate read at a time: memory bounded whatever the input's size


def _by_parts(
    input: Path | None, output: Path | None, do_part: Callable[[list[str], int, Callable], list[str]]
) -> None:
    """Turn the lines of ``input`` (a file, or stdin) into the lines of ``output`` (a file, written
    atomically, or stdout) a part of ``PART_LINES`` lines at a time: ``do_part(lines, number of the
    first, progress)``, with a progress bar of lines done on a terminal."""
    from itertools import islice

    from attnkit.atomic import atomic_writer
    from attnkit.data.readers import iter_lines

    lines = iter_lines(input)
    with _progress_bar() as bar, contextlib.ExitStack() as files:
        write = _stream if output is None else files.enter_context(atomic_writer(output)).write
        first = 1
        while part := list(islice(lines, PART_LINES)):
            write("".join(line + "\n" for line in do_part(part, first, bar.update)))
            first += len(part)


def _progress_bar(total: int | None = None):
    """A progress bar of lines done, on stderr when it is a terminal (none in logs and pipes)."""
    from tqdm import tqdm

    return tqdm(total=total, disable=not sys.stderr.isatty(), unit=" lines", dynamic_ncols=True, leave=False)


@app.command(context_settings=EXTRA_ARGS)
@one_line_errors
def generate(
    ctx: typer.Context,
    ckpt: Annotated[Path, typer.Option(help="Checkpoint folder or run directory of a decoder model.")],
    prompt: Annotated[
        str | None,
        typer.Option(
            help="Text to continue, streamed as it is written (default: a newline).", callback=_as_sent
        ),
    ] = None,
    input: Annotated[
        Path | None,
        typer.Option(
            "-i", "--input", help="Prompts, one per line (- for stdin); writes JSON Lines {prompt, text}."
        ),
    ] = None,
    output: OutputFile = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="At most this many new tokens.")] = None,
    temperature: Annotated[float | None, typer.Option(help="0 = greedy; higher = more varied.")] = None,
    top_k: Annotated[
        int | None, typer.Option(help="Sample among the k most probable tokens; 0 = all.")
    ] = None,
    top_p: Annotated[
        float | None, typer.Option(help="... and the smallest set holding this probability.")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Prompt i samples with seed + i.")] = None,
    stop: Annotated[list[str] | None, typer.Option(help="End where this text appears (repeatable).")] = None,
    streams: Annotated[
        int | None, typer.Option(help="CPU, with -i: batches at a time, each on its share of the threads.")
    ] = None,
    engine: Engine = "attnkit",
    int8: Int8 = False,
) -> None:
    """Continue text with a decoder (GPT-style) model; the run's decode settings unless overridden (by
    the options, or by extra ``decode.field=value`` arguments).

    One prompt's continuation streams to stdout as it is written. A file of prompts (-i) is read and
    continued 50,000 lines at a time, as translate reads its input, with a progress bar on a
    terminal; prompt i samples with seed + i whichever part it falls in."""
    import json

    from attnkit.decode.generate import generate as generate_texts
    from attnkit.train.distributed import resolve_device

    if prompt is not None and input is not None:
        raise AttnkitError("give --prompt TEXT or -i FILE, not both")
    check_engine(engine, int8)
    if output is not None:
        writable_file(output)
    given = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
             "seed": seed, "stop": stop, "streams": streams}  # fmt: skip
    overrides = decode_overrides(ctx)
    if engine == "ctranslate2":
        from attnkit.decode.ct2 import CTranslate2Generator

        generator = _with_options(given, lambda changes: CTranslate2Generator(ckpt, overrides, changes))

        def run(texts: list[str], on_text=None, **part) -> list[str]:
            return generator.generate(texts, on_text=on_text, **part)
    else:
        from dataclasses import replace

        from attnkit.config import with_decode_overrides

        device = resolve_device()
        model, tokenizer, config = _load(ckpt, device, archs(using="generate"), int8)
        decode = _with_options(
            given, lambda changes: replace(with_decode_overrides(config.decode, overrides), **changes)
        )

        def run(texts: list[str], on_text=None, **part) -> list[str]:
            return generate_texts(model, tokenizer, texts, decode, device=device, on_text=on_text, **part)

    if input is None:  # one prompt: stream its continuation to stdout, or write it to the output file
        text = "\n" if prompt is None else prompt
        streaming = output is None
        if streaming:
            _stream(text)
        (continuation,) = run([text], on_text=(lambda _, piece: _stream(piece)) if streaming else None)
        _write_output(output, "\n" if streaming else text + continuation + "\n")
        return

    def generate_part(prompts: list[str], first: int, progress: Callable[[int], None]) -> list[str]:
        texts = run(prompts, progress=progress, first=first - 1)
        return [
            json.dumps({"prompt": p, "text": t}, ensure_ascii=False)
            for p, t in zip(prompts, texts, strict=True)
        ]

    _by_parts(input, output, generate_part)


@app.command(context_settings=EXTRA_ARGS)
@one_line_errors
def evaluate(
    ctx: typer.Context,
    ckpt: Annotated[Path, typer.Option(help="Checkpoint folder or run directory.")],
    src: Annotated[
        Path | None, typer.Option(help="Translation: source sentences, one per line (.gz allowed).")
    ] = None,
    ref: Annotated[Path | None, typer.Option(help="Translation: references, aligned with --src.")] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            help="Classifier: a TSV file of sentence<TAB>label lines; summariser: a JSON Lines file; "
            "decoder (GPT-style): a text file."
        ),
    ] = None,
    beam: Annotated[int | None, typer.Option(help="Translation: beam size; 1 = greedy.")] = None,
    streams: Annotated[
        int | None,
        typer.Option(help="Translation, CPU: batches at a time, each on its share of the threads."),
    ] = None,
    engine: Engine = "attnkit",
    plot: Annotated[
        Path | None, typer.Option(help="Glimpse model: save its glimpse paths on 8 test images (PNG).")
    ] = None,
    int8: Int8 = False,
) -> None:
    """Score a model: a translation model's sacreBLEU BLEU and chrF on --src against --ref, a
    summariser's ROUGE-1/2/L on the records of --data, a classifier's accuracy and macro-F1 on the
    labelled sentences of --data, a decoder's perplexity on the text of --data (in blocks of its context,
    as training validates), or an image model's accuracy on its task's generated test images (digits
    never seen in training).

    For translation every pair is scored: an empty source line is translated as an empty line, and the
    counts of empty sources and references are printed. Extra ``decode.field=value`` arguments change
    how a translation model or summariser decodes, as for translate."""
    from attnkit.checkpoint import a_model, read_run_config, resolve_checkpoint
    from attnkit.config import with_decode_overrides

    at_least("--beam", beam, 1)
    at_least("--streams", streams, 0)
    overrides = decode_overrides(ctx, streams)
    check_engine(engine, int8)
    if engine == "ctranslate2":  # an exported folder: a translation model, or a decoder's perplexity
        if data is not None and src is None and ref is None:
            _evaluate_text(ckpt, data, int8, engine, overrides)
        elif data is not None or src is None or ref is None:
            raise AttnkitError("--engine ctranslate2 scores a translation model (--src FILE --ref FILE) or a "
                               "decoder's perplexity (--data FILE.txt)")  # fmt: skip
        else:
            _evaluate_translation(ckpt, src, ref, beam, overrides, engine, int8)
        return
    run_config = read_run_config(resolve_checkpoint(ckpt))
    with_decode_overrides(run_config.decode, overrides)  # checked before any work
    arch = run_config.model.arch
    if plot is not None and arch != "glimpse":
        raise AttnkitError(f"--plot draws a glimpse model's glimpses; {ckpt} holds {a_model(arch)}")
    if arch in IMAGE_ARCHS:
        if data is not None or src is not None or ref is not None:
            raise AttnkitError(
                f"{ckpt} holds {a_model(arch)}: it is evaluated on its own generated test images"
            )
        _no_decoding(overrides, int8, arch)
        _evaluate_images(ckpt, plot)
    elif arch == "encoder":
        if data is None or src is not None or ref is not None:
            raise AttnkitError(f"{ckpt} holds an encoder model: evaluate it with --data FILE.tsv")
        _no_decoding(overrides, int8, arch)
        _evaluate_classifier(ckpt, data)
    elif arch == "decoder":
        if data is None or src is not None or ref is not None:
            raise AttnkitError(f"{ckpt} holds a decoder model: evaluate its perplexity with --data FILE.txt")
        _no_decoding(overrides, False, arch)
        _evaluate_text(ckpt, data, int8, engine)
    elif run_config.data.task == "summarise":
        if data is None or src is not None or ref is not None:
            raise AttnkitError(f"{ckpt} holds a summariser: evaluate it with --data FILE.jsonl")
        _evaluate_summaries(ckpt, data, beam, overrides, int8)
    elif data is not None or src is None or ref is None:
        raise AttnkitError(f"{ckpt} holds {a_model(arch)}: evaluate it with --src FILE --ref FILE")
    else:
        _evaluate_translation(ckpt, src, ref, beam, overrides, engine, int8)


ENGINES = ("attnkit", "ctranslate2")


def _with_options(given: dict[str, Any], load: Callable[[dict[str, Any]], T]) -> T:
    """``load(changes)`` with the decode settings the options gave (``given``: None = not given); a value
    out of range names its option (``--top-k``), not the config field (``decode.top_k``)."""
    changes = {name: value for name, value in given.items() if value is not None}
    try:
        return load(changes)
    except AttnkitError as error:
        message = str(error)
        for name in changes:
            message = message.replace(f"decode.{name}", "--" + name.replace("_", "-"))
        raise AttnkitError(message) from None


def check_engine(engine: str, int8: bool) -> None:
    """A one-line error unless ``--engine`` names one of :data:`ENGINES`, or if ``--int8`` (attnkit's own
    quantisation) comes with CTranslate2, whose int8 is chosen at export."""
    if engine not in ENGINES:
        raise AttnkitError(f"--engine {engine!r}: choose {' or '.join(ENGINES)}")
    if int8 and engine == "ctranslate2":
        raise AttnkitError("--int8 is attnkit's; CTranslate2 takes int8 at export: --quantization int8")


def _no_decoding(overrides: list[str], int8: bool, arch: str) -> None:
    """A one-line error if decode settings or --int8 were given for a model scored without decoding."""
    from attnkit.checkpoint import a_model

    if overrides or int8:
        given = " ".join(overrides + (["--int8"] if int8 else []))
        raise AttnkitError(f"{given}: {a_model(arch)} is scored without decoding")


def _load_translator(ckpt: Path, device: torch.device, overrides: list[str], int8: bool = False):
    """A translation or summarisation checkpoint (Transformer or RNN) loaded for decoding on ``device``,
    its decode settings changed by ``overrides`` (``decode.field=value``); ``int8``: see :func:`_load`."""
    from attnkit.config import with_decode_overrides

    model, tokenizer, config = _load(ckpt, device, archs(using="translate"), int8)
    config.decode = with_decode_overrides(config.decode, overrides)
    return model, tokenizer, config


def _load(ckpt: Path, device: torch.device, accepted: str | tuple[str, ...], int8: bool = False):
    """``load_for_inference`` of a checkpoint of the ``accepted`` architectures; ``int8``: its linear
    maps multiply int8 weights and inputs (``--int8``, CPU only) instead of packed float32 ones."""
    from attnkit.attention.linear import quantize_int8
    from attnkit.checkpoint import load_for_inference

    if int8 and device.type != "cpu":
        raise AttnkitError(f"--int8 is for CPUs; this run would decode on {device.type}")
    model, tokenizer, config = load_for_inference(ckpt, device, arch=accepted, pack=not int8)
    if int8:
        quantize_int8(model)
    return model, tokenizer, config


def _ctranslate2(folder: Path, overrides: list[str]) -> CTranslate2Translator:
    """The CTranslate2 engine of an exported folder, its decode settings changed by ``overrides``."""
    from attnkit.decode.ct2 import CTranslate2Translator

    return CTranslate2Translator(folder, overrides, warn=_note)


def _evaluate_translation(
    ckpt: Path, src: Path, ref: Path, beam: int | None, overrides: list[str], engine: str, int8: bool
) -> None:
    from attnkit.data.readers import read_parallel
    from attnkit.decode.translate import translate as translate_texts
    from attnkit.metrics import bleu, chrf
    from attnkit.train.distributed import resolve_device

    pairs = read_parallel(src, ref, drop_empty=False)
    if engine == "ctranslate2":
        translator = _ctranslate2(ckpt, overrides)

        def run(texts: list[str], progress: Callable[[int], None]) -> list[str]:
            return translator.translate(texts, beam, progress)
    else:
        device = resolve_device()
        model, tokenizer, config = _load_translator(ckpt, device, overrides, int8)

        def run(texts: list[str], progress: Callable[[int], None]) -> list[str]:
            return translate_texts(model, tokenizer, texts, config.decode, beam_size=beam, device=device,
                                   warn=_note, progress=progress)  # fmt: skip

    began = time.perf_counter()
    with _progress_bar(len(pairs)) as bar:
        hypotheses = run(pairs.src, bar.update)
    seconds = time.perf_counter() - began
    typer.echo(str(bleu(hypotheses, pairs.tgt)))
    typer.echo(str(chrf(hypotheses, pairs.tgt)))
    empty_src, empty_ref = pairs.count_empty()
    typer.echo(
        f"{len(pairs)} sentences in {seconds:.1f} s; {empty_src} with an empty source (scored as an "
        f"empty translation), {empty_ref} with an empty reference"
    )


def _evaluate_summaries(ckpt: Path, data: Path, beam: int | None, overrides: list[str], int8: bool) -> None:
    """ROUGE of the run's summaries of ``data``'s sources, cut as in training, against the target field
    and, where the run names one (``data.references``), against those references (the best counting)."""
    from attnkit.decode.translate import translate as translate_texts
    from attnkit.metrics import rouge
    from attnkit.tasks.translation import cut_sources, read_summaries
    from attnkit.train.distributed import resolve_device

    device = resolve_device()
    model, tokenizer, config = _load_translator(ckpt, device, overrides, int8)
    records = read_summaries(config.data, data)
    _, cut = cut_sources(tokenizer.encode_batch(records.src), config.data.source_limit)
    began = time.perf_counter()
    summaries = translate_texts(model, tokenizer, records.src, config.decode, beam_size=beam, device=device,
                                source_limit=config.data.source_limit)  # fmt: skip
    seconds = time.perf_counter() - began
    for field, refs in records.references.items():
        scores = rouge(summaries, refs)
        typer.echo(f"against {field!r}: " + ", ".join(f"{s.name} {s.score:.2f}" for s in scores))
    typer.echo(f"({scores[0].signature}); {len(records)} records in {seconds:.1f} s, {cut} sources cut to "
               f"{config.data.source_limit} tokens")  # fmt: skip


def _load_encoder(ckpt: Path, heads: tuple[str, ...], device: torch.device):
    """An encoder checkpoint whose head is one of ``heads`` (a one-line error names what it has)."""
    from attnkit.checkpoint import load_for_inference

    model, tokenizer, config = load_for_inference(ckpt, device, arch=archs(using="predict"))
    if config.model.head not in heads:
        what = {"mlm": "a masked-LM model: pre-training, to fine-tune with train.init_from",
                "none": "an encoder without a head"}.get(config.model.head, config.model.head)  # fmt: skip
        raise AttnkitError(f"{ckpt} holds {what}; this command needs a {' or '.join(heads)} head")
    return model, tokenizer, config


def _evaluate_text(ckpt: Path, data: Path, int8: bool, engine: str, overrides: Sequence[str] = ()) -> None:
    """A decoder's cross-entropy and perplexity on the text file ``data``, in blocks of its context: by
    attnkit (as training validates, ``train.max_tokens`` a batch) or by CTranslate2 (an exported folder,
    ``decode.batch_size`` blocks a batch)."""
    from attnkit.data.readers import read_text
    from attnkit.tasks.language_modelling import text_perplexity
    from attnkit.train.distributed import resolve_device

    if engine == "ctranslate2":
        from attnkit.decode.ct2 import CTranslate2Generator

        generator = CTranslate2Generator(ckpt, overrides)
        scored, context = generator.perplexity(read_text(data)), generator.context
    else:
        device = resolve_device()
        model, tokenizer, config = _load(ckpt, device, archs(using="generate"), int8)
        per_batch = max(1, config.train.max_tokens // config.model.max_len)  # as training's validation
        scored = text_perplexity(model, tokenizer, read_text(data), per_batch, device)
        context = config.model.max_len
    typer.echo(f"perplexity = {scored['perplexity']:.3f} (cross-entropy {scored['loss']:.4f} nats per token, "
               f"{scored['tokens']:,} tokens predicted in blocks of {context})")  # fmt: skip


def _evaluate_classifier(ckpt: Path, data: Path) -> None:
    from attnkit.data.readers import read_labelled
    from attnkit.tasks.classification import score_classifier
    from attnkit.train.distributed import resolve_device

    labelled = read_labelled(data)
    device = resolve_device()
    model, tokenizer, config = _load_encoder(ckpt, ("classify",), device)
    began = time.perf_counter()
    accuracy, f1, correct = score_classifier(model, tokenizer, config.data.labels, labelled, data,
                                             config.decode.batch_size, device)  # fmt: skip
    seconds = time.perf_counter() - began
    typer.echo(f"accuracy {accuracy:.4f} ({correct}/{len(labelled)}), macro-F1 {f1:.4f}")
    typer.echo(f"{len(labelled)} sentences of {data} in {seconds:.1f} s")


def _evaluate_images(ckpt: Path, plot: Path | None) -> None:
    from attnkit.checkpoint import load_for_inference
    from attnkit.tasks.image_classification import accuracy, image_batch, split_canvases
    from attnkit.train.distributed import resolve_device

    if plot is not None:
        writable_file(plot)
    device = resolve_device()
    model, _, config = load_for_inference(ckpt, device, arch=IMAGE_ARCHS)
    test = split_canvases(config, "test")
    began = time.perf_counter()
    score = accuracy(model, test, config.train.batch_size, device)
    typer.echo(f"accuracy {score:.4f} on {len(test)} test images ({time.perf_counter() - began:.1f} s)")
    if plot is not None:
        from attnkit.viz.glimpses import plot_glimpse_paths

        batch = image_batch(test, list(range(min(8, len(test))))).to(device)
        typer.echo(f"glimpse paths: {plot_glimpse_paths(model, batch.images, batch.labels, plot)}")


@app.command()
@one_line_errors
def predict(
    ckpt: Annotated[Path, typer.Option(help="Checkpoint folder or run directory of an encoder model.")],
    text: Annotated[
        str | None, typer.Option(help="One input (default: lines of -i or stdin).", callback=_as_sent)
    ] = None,
    input: Annotated[
        Path | None, typer.Option("-i", "--input", help="One input per line (default: stdin).")
    ] = None,
    output: OutputFile = None,
) -> None:
    """Run an encoder model on each input line. A classifier prints ``label<TAB>probability``; a
    question-answering model reads ``question<TAB>passage`` and prints the answer span."""
    from attnkit.tasks.classification import classify
    from attnkit.tasks.span_qa import answer
    from attnkit.train.distributed import resolve_device

    if text is not None and input is not None:
        raise AttnkitError("give --text TEXT or -i FILE, not both")
    if output is not None:
        writable_file(output)
    device = resolve_device()
    model, tokenizer, config = _load_encoder(ckpt, ("classify", "span"), device)
    lines = [text] if text is not None else _read_input(input)
    size = config.decode.batch_size
    if config.model.head == "classify":
        probabilities = classify(model, tokenizer, lines, size, device)
        best, label = probabilities.max(-1)
        rows = [
            f"{config.data.labels[i]}\t{p:.4f}" for p, i in zip(best.tolist(), label.tolist(), strict=True)
        ]
    else:
        where = "--text" if text is not None else (input or "stdin")
        pairs = [line.split("\t", 1) for line in lines]
        for number, pair in enumerate(pairs, start=1):
            if len(pair) != 2:
                raise AttnkitError(
                    f"{where}:{number}: no tab; a question-answering input is question<TAB>passage"
                )
        rows = answer(model, tokenizer, [q for q, _ in pairs], [p for _, p in pairs], size, device)
    _write_output(output, "".join(row + "\n" for row in rows))


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
    from attnkit.checkpoint import average_checkpoints, list_checkpoints
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


@app.command()
@one_line_errors
def explore(
    ckpt: Annotated[Path, typer.Option(help="Checkpoint folder or run directory of a Transformer.")],
    text: Annotated[
        str, typer.Option(help="The sentence (source, prompt or text) to look at.", callback=_as_sent)
    ] = "",
    target: Annotated[
        str | None,
        typer.Option(
            help="Encoder-decoder: the output to look at (default: its own translation).", callback=_as_sent
        ),
    ] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML page to write.")] = Path(
        "attention.html"
    ),
    serve: Annotated[
        bool, typer.Option("--serve", help="Serve the page on 127.0.0.1 with a text box instead.")
    ] = False,
    port: Annotated[int, typer.Option(help="--serve: the port.")] = 8000,
) -> None:
    """Write one self-contained HTML page with every layer and head of the model's attention on TEXT:
    a layers × heads grid, each head's matrix with its tokens, a token view and, for translation, the
    alignment. Open it in any browser; it fetches nothing. --serve: type sentences in a local page."""
    from attnkit.atomic import write_text_atomic
    from attnkit.checkpoint import load_for_inference
    from attnkit.viz import explorer as page

    if not serve:
        writable_file(output)
    model, tokenizer, _ = load_for_inference(ckpt, "cpu")
    if serve:
        page.serve(model, tokenizer, native_path(ckpt), text, port)
        return
    if not text.strip():
        raise AttnkitError("--text is empty: give a sentence to look at (or --serve to type them)")
    maps, translation = page.collect_attention(model, tokenizer, text, target)
    title = f"attention of {native_path(ckpt)} on: {text}"  # the page is UTF-8 text, whatever the locale
    write_text_atomic(output, page.explorer_html(maps, title, translation))
    layers, heads = len(maps[0].weights), len(maps[0].weights[0])
    typer.echo(f"{output}: {len(maps)} attention(s) × {layers} layers × {heads} heads; open it in a browser")


@app.command("import-hf")
@one_line_errors
def import_hf(
    folder: Annotated[
        Path, typer.Argument(help="HF model folder: config.json, model.safetensors, tokenizer.json.")
    ],
    out: Annotated[Path, typer.Option(help="The run directory to write.")],
    overwrite: Overwrite = False,
) -> None:
    """Turn a local HF model folder (Marian translation, BERT-family or GPT-2; what save_pretrained
    writes) into an attnkit run directory that translate / predict / generate / evaluate use.

    Importing the same folder again replaces the earlier import; a run directory holding anything else
    (a trained run, another import) is refused unless --overwrite, which deletes its checkpoints first."""
    from attnkit.checkpoint import (
        a_model,
        clear_run,
        commands_for,
        earlier_run,
        list_checkpoints,
        save_checkpoint,
    )
    from attnkit.config import RunConfig
    from attnkit.folders import MadeBy, made_by
    from attnkit.models.convert import from_hf
    from attnkit.models.convert.hf_folder import label_names

    maker = MadeBy.of("attnkit import-hf", folder)
    earlier = earlier_run(out)
    again = (
        bool(earlier) and all(made_by(c) == maker for c in list_checkpoints(out)) and list_checkpoints(out)
    )
    if earlier and not (again or overwrite):
        raise AttnkitError(
            f"{out} already holds a run ({', '.join(p.name for p in earlier[:3])}), not an import of "
            f"{folder}; import into a new directory, or pass --overwrite to replace it"
        )
    model, tokenizer = from_hf(folder)
    run_config = RunConfig.for_model(model.config)
    if getattr(model.config, "head", None) == "classify":
        run_config.data.labels = label_names(folder, model.config.num_labels)
    config = run_config.to_dict()
    if earlier and not again:  # --overwrite: the earlier run goes, as attnkit train --overwrite does
        clear_run(out)
    written = save_checkpoint(out, 0, model=model, config=config, tokenizer_json=tokenizer.to_str(),
                              is_best=True, command=maker.command, source=maker.source)  # fmt: skip
    typer.echo(
        f"{written}: {a_model(model.config.arch)}; use it with {commands_for(model.config.arch)} --ckpt {out}"
    )


@app.command()
@one_line_errors
def export(
    ckpt: Annotated[Path, typer.Option(help="Checkpoint folder or run directory of a Transformer.")],
    out: Annotated[
        Path,
        typer.Option(help="The folder to write: a new or empty one, or this checkpoint's earlier export."),
    ],
    to: Annotated[
        str,
        typer.Option(
            help="hf: a folder HF transformers' from_pretrained loads (Marian, GPT-2 or BERT); "
            "ctranslate2: a CTranslate2 model (a translation model or a GPT-style decoder)."
        ),
    ] = "hf",
    quantization: Annotated[
        str | None, typer.Option(help="ctranslate2: int8, int8_float32, ... (default: float32 weights).")
    ] = None,
    overwrite: Overwrite = False,
) -> None:
    """Export a Transformer for another tool: --to hf writes a folder that HF transformers'
    from_pretrained loads (a translation model as MarianMTModel, a GPT-style decoder as GPT2LMHeadModel,
    a BERT-style encoder as the Bert class of its head); --to ctranslate2 a translation model or a
    GPT-style decoder for CTranslate2 (attnkit translate / generate --engine ctranslate2).

    Models with the paper's interleaved sinusoids are reordered exactly into Marian's layout. Exporting
    the same checkpoint again replaces the earlier export; any other folder is refused unless
    --overwrite, and the checkpoint exported is never replaced."""
    from attnkit.checkpoint import (
        ctranslate2_command,
        load_for_inference,
        refuse_to_replace_a_source,
        resolve_checkpoint,
    )
    from attnkit.folders import MadeBy
    from attnkit.models.convert.bert import HF_CLASS
    from attnkit.models.convert.export import export_ctranslate2, export_hf

    if to not in ("hf", "ctranslate2"):
        raise AttnkitError(f"--to {to!r}: attnkit exports to 'hf' (HF transformers) or 'ctranslate2'")
    if quantization is not None and to != "ctranslate2":
        raise AttnkitError("--quantization is for --to ctranslate2")
    exported = archs(exporting=to)
    model, tokenizer, config = load_for_inference(ckpt, "cpu", arch=exported, pack=False)
    checkpoint = resolve_checkpoint(ckpt)
    refuse_to_replace_a_source(out, [checkpoint])
    maker = MadeBy.of(f"attnkit export --to {to}", checkpoint)
    if to == "ctranslate2":
        written = export_ctranslate2(model, tokenizer, vars(config.decode), out, quantization,
                                     maker=maker, overwrite=overwrite)  # fmt: skip
        arch = config.model.arch
        typer.echo(f"{written}: {ARCHITECTURES[arch].commands[0]} with {ctranslate2_command(written, arch)}")
        if arch == "encoder-decoder" and config.decode.length_penalty != "length":
            typer.echo(f"note: CTranslate2 ranks beams by log P / length^{config.decode.alpha}; this run's "
                       f"decode.length_penalty={config.decode.length_penalty} has no CTranslate2 equivalent",
                       err=True)  # fmt: skip
        return
    written = export_hf(model, tokenizer, out, config.data.labels, maker=maker, overwrite=overwrite)
    arch = config.model.arch
    if arch == "encoder-decoder":
        kind, inputs = "MarianMTModel", "append </s> to each source's ids, as attnkit does"
    elif arch == "decoder":
        kind, inputs = "GPT2LMHeadModel", "a prompt is its tokens, as in attnkit generate"
    else:
        kind, inputs = HF_CLASS[config.model.head], "a sentence is [CLS] + its tokens + [SEP], as in attnkit"
    typer.echo(f"{written}: load it with transformers.{kind}.from_pretrained({str(written)!r}); {inputs}")


data_app = typer.Typer(no_args_is_help=True, help="The standard data sets, laid out as the recipes expect.")
app.add_typer(data_app, name="data")


@data_app.command("get")
@one_line_errors
def data_get(
    name: Annotated[str, typer.Argument(help="multi30k, iwslt14, sst2 or tinyshakespeare.")],
    folder: Annotated[Path, typer.Argument(help="Where to put the files (made if needed).")],
    mirror: Annotated[
        str | None, typer.Option(help="Fetch MIRROR/NAME/FILE instead of from the publishers.")
    ] = None,
) -> None:
    """Download a data set with its checksum checked; a broken download resumes when run again, and
    files already there (and right) are not fetched again."""
    from attnkit.data.download import ALGORITHM_NAMES, DATASETS, get_dataset

    checked = {file.name: ALGORITHM_NAMES[file.algorithm] for file in DATASETS.get(name, [])}
    for path in get_dataset(name, folder, mirror, progress=sys.stderr.isatty()):
        how = f"{checked[path.name]} checked" if path.name in checked else "made from it"
        typer.echo(f"{path}: {path.stat().st_size:,} bytes, {how}")
    recipe = {
        "multi30k": "multi30k_de_en",
        "iwslt14": "iwslt14_de_en",
        "sst2": "sst2_from_scratch",
        "tinyshakespeare": "shakespeare_char",
    }
    typer.echo(f"ready: attnkit train configs/{recipe[name]}.yaml --data {folder} --run-dir runs/{name}")


cache_app = typer.Typer(no_args_is_help=True, help="The compiled decoding steps decode.compile keeps.")
app.add_typer(cache_app, name="cache")


@cache_app.command("info")
@one_line_errors
def cache_info() -> None:
    """Where the compiled steps are kept, how many, and how much room they take (at most 2 GiB: beyond
    that, and after 30 days unused, steps are deleted)."""
    from attnkit.decode.compiled import cache_folder, cached_steps

    steps = cached_steps()
    size = sum(bytes_ for _, bytes_, _ in steps)
    typer.echo(f"{cache_folder()}: {len(steps)} compiled step(s), {size / 2**20:.1f} MiB")


@cache_app.command("clear")
@one_line_errors
def cache_clear() -> None:
    """Delete every compiled step (each is compiled again when next needed)."""
    from attnkit.decode.compiled import cache_folder, cached_steps, remove_step

    steps = cached_steps()
    for package, _, _ in steps:
        remove_step(package)
    size = sum(bytes_ for _, bytes_, _ in steps)
    typer.echo(f"{cache_folder()}: deleted {len(steps)} compiled step(s), {size / 2**20:.1f} MiB")


@app.callback()
def describe() -> None:
    """attnkit: the Transformer of "Attention Is All You Need" and the attention family around it.

    A mistake (a missing file, a bad value, a malformed line) is reported in one line that names it, with
    exit status 2; options and output paths are checked before any work starts."""


def _as_help(doc: Any) -> Any:
    """A docstring as typer should show it: each paragraph one line, which the terminal wraps (typer
    keeps the line breaks of every paragraph after the first, so a docstring's 110-column lines came out
    broken mid-sentence), and ``code`` quoted as 'code'."""
    if not isinstance(doc, str):  # None, or typer's placeholder for "not given"
        return doc
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs).replace("``", "'")


def _set_help(typer_app: typer.Typer) -> None:
    typer_app.info.help = _as_help(typer_app.info.help)
    if typer_app.registered_callback is not None:
        typer_app.registered_callback.help = _as_help(typer_app.registered_callback.callback.__doc__)
    for command in typer_app.registered_commands:
        command.help = _as_help(command.help or command.callback.__doc__)
    for group in typer_app.registered_groups:
        group.help = _as_help(group.help)
        _set_help(group.typer_instance)


_set_help(app)


if __name__ == "__main__":
    main()
