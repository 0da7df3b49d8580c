"""``attnkit translate``, ``generate`` and ``predict``: a trained model on new inputs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from attnkit.cli.loading import (
    check_engine,
    ctranslate2_translator,
    load_encoder,
    load_translator,
    with_options,
)
from attnkit.cli.shared import (
    EXTRA_ARGS,
    Engine,
    Int8,
    OutputFile,
    Precision,
    app,
    as_sent,
    at_least,
    decode_overrides,
    note,
    one_line_errors,
    precision_override,
    progress_bar,
    stream_out,
    writable_file,
    write_output,
)
from attnkit.errors import AttnkitError
from attnkit.models import archs

if TYPE_CHECKING:
    from attnkit.decode.search import Translation
    from attnkit.processes import World


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
    precision: Precision = None,
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
    at_least("--beam", beam, 1)
    at_least("--streams", streams, 0)
    at_least("--n-best", n_best, 0)
    check_engine(engine, precision, int8)
    overrides = decode_overrides(ctx, streams) + precision_override(precision, int8)
    if output is not None:
        writable_file(output)
    with processes(input) as world:
        if engine == "ctranslate2":
            ct2 = ctranslate2_translator(ckpt, overrides)
            check_n_best(n_best, beam or ct2.decode.beam_size)

            def ct2_part(texts: list[str], first: int, progress: Callable[[int], None]) -> list[str]:
                if not n_best:
                    return ct2.translate(texts, beam, progress)
                return n_best_lines(ct2.translate_n_best(texts, n_best, beam, progress), first)

            by_parts(input, output, ct2_part, world)
        else:
            _translate_with_attnkit(ckpt, beam, input, output, n_best, overrides, world)


def _translate_with_attnkit(ckpt, beam, input, output, n_best, overrides, world) -> None:
    from attnkit.decode.translate import Reporting
    from attnkit.decode.translate import translate as translate_texts
    from attnkit.processes import resolve_device
    from attnkit.tasks import task_of

    device = resolve_device()
    model, tokenizer, config = load_translator(ckpt, device, overrides)
    check_n_best(n_best, beam or config.decode.beam_size)
    source_limit = config.data.source_limit if task_of(config).cuts_sources else None  # as in training
    settings = dict(beam_size=beam, source_limit=source_limit)

    def translate_part(texts: list[str], first: int, progress: Callable[[int], None]) -> list[str]:
        found = translate_texts(model, tokenizer, texts, config.decode, n_best=n_best,
                                reporting=Reporting(note, progress, first), **settings)  # fmt: skip
        return n_best_lines(found, first) if n_best else found

    by_parts(input, output, translate_part, world)


def check_n_best(n_best: int, beam: int) -> None:
    """``--n-best`` against the beam (``BeamSettings``' rule), in the command line's words."""
    from attnkit.decode.search import BeamSettings

    try:
        BeamSettings(beam, max(n_best, 1))
    except ValueError:
        raise AttnkitError(
            f"--n-best {n_best} needs a beam at least as wide: give --beam {n_best} or more"
        ) from None


def n_best_lines(found: list[list[Translation]], first: int) -> list[str]:
    """``LINE ||| TRANSLATION ||| SCORE`` for each hypothesis of each line (LINE from 0; ``first`` is the
    number of the part's first line, from 1)."""
    return [
        f"{first - 1 + i} ||| {text} ||| {score:.4f}"
        for i, best in enumerate(found)
        for text, score, _ in best
    ]


PART_LINES = 50_000  # lines translate and generate read at a time: memory bounded whatever the input's size


def by_parts(
    input: Path | None,
    output: Path | None,
    do_part: Callable[[list[str], int, Callable], list[str]],
    world: World | None = None,
) -> None:
    """Turn the lines of ``input`` (a file, or stdin) into the lines of ``output`` (a file, written
    atomically, or stdout) a part of ``PART_LINES`` lines at a time: ``do_part(lines, number of the
    first, progress)``, with a progress bar of lines done on a terminal.

    Under torchrun (``world`` of several processes), every process reads the input, does its own
    contiguous share of each part, and the first process gathers the shares in order and writes them:
    one output, in input order, the same as one process writes."""
    from itertools import islice

    from attnkit.atomic import atomic_writer
    from attnkit.data.readers import iter_lines
    from attnkit.processes import World, share

    world = world or World()
    lines = iter_lines(input)
    with progress_bar(show=world.is_main) as bar, contextlib.ExitStack() as files:
        write = None
        if world.is_main:
            write = stream_out if output is None else files.enter_context(atomic_writer(output)).write
        first = 1
        while part := list(islice(lines, PART_LINES)):
            mine = share(len(part), world)
            done = world.all_gather(do_part(part[mine], first + mine.start, bar.update))
            if write is not None:
                write("".join(line + "\n" for lines_done in done for line in lines_done))
            first += len(part)


@contextlib.contextmanager
def processes(input: Path | None) -> Iterator[World]:
    """This process's place among those torchrun started (one process otherwise), for the length of a
    command; every process reads the input itself, so under torchrun it must be a file."""
    from attnkit.processes import close_world, init_world, resolve_device

    world = init_world(resolve_device().type)
    try:
        if world.size > 1 and (input is None or str(input) == "-"):
            raise AttnkitError(
                "under torchrun every process reads the input: give it as -i FILE (not stdin, not one text)"
            )
        yield world
    finally:
        close_world(world)


@app.command(context_settings=EXTRA_ARGS)
@one_line_errors
def generate(
    ctx: typer.Context,
    ckpt: Annotated[Path, typer.Option(help="Checkpoint folder or run directory of a decoder model.")],
    prompt: Annotated[
        str | None,
        typer.Option(
            help="Text to continue, streamed as it is written (default: a newline).", callback=as_sent
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
    precision: Precision = None,
    int8: Int8 = False,
) -> None:
    """Continue text with a decoder (GPT-style) model; the run's decode settings unless overridden (by
    the options, or by extra ``decode.field=value`` arguments).

    One prompt's continuation streams to stdout as it is written. A file of prompts (-i) is read and
    continued 50,000 lines at a time, as translate reads its input, with a progress bar on a
    terminal; prompt i samples with seed + i whichever part it falls in."""
    if prompt is not None and input is not None:
        raise AttnkitError("give --prompt TEXT or -i FILE, not both")
    check_engine(engine, precision, int8)
    if output is not None:
        writable_file(output)
    given = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
             "seed": seed, "stop": stop, "streams": streams}  # fmt: skip
    overrides = decode_overrides(ctx) + precision_override(precision, int8)
    with processes(input) as world:
        _generate(ckpt, prompt, input, output, engine, given, overrides, world)


def _generate(ckpt, prompt, input, output, engine, given, overrides, world) -> None:
    import json

    from attnkit.decode.generate import Listening
    from attnkit.decode.generate import generate as generate_texts
    from attnkit.processes import resolve_device

    if engine == "ctranslate2":
        from attnkit.decode.ct2 import CTranslate2Generator

        generator = with_options(given, lambda changes: CTranslate2Generator(ckpt, overrides, changes))

        def run(texts: list[str], on_text=None, **part) -> list[str]:
            return generator.generate(texts, Listening(on_text), **part)
    else:
        from dataclasses import replace

        from attnkit.loading import load_for_inference

        device = resolve_device()
        model, tokenizer, config = load_for_inference(
            ckpt, device, arch=archs(using="generate"), overrides=overrides
        )
        decode = with_options(given, lambda changes: replace(config.decode, **changes))

        def run(texts: list[str], on_text=None, **part) -> list[str]:
            return generate_texts(model, tokenizer, texts, decode, listening=Listening(on_text), **part)

    if input is None:  # one prompt: stream its continuation to stdout, or write it to the output file
        text = "\n" if prompt is None else prompt
        streaming = output is None
        if streaming:
            stream_out(text)
        (continuation,) = run([text], on_text=(lambda _, piece: stream_out(piece)) if streaming else None)
        write_output(output, "\n" if streaming else text + continuation + "\n")
        return

    def generate_part(prompts: list[str], first: int, progress: Callable[[int], None]) -> list[str]:
        texts = run(prompts, progress=progress, first=first - 1)
        return [
            json.dumps({"prompt": p, "text": t}, ensure_ascii=False)
            for p, t in zip(prompts, texts, strict=True)
        ]

    by_parts(input, output, generate_part, world)


@app.command(context_settings=EXTRA_ARGS)
@one_line_errors
def predict(
    ctx: typer.Context,
    ckpt: Annotated[Path, typer.Option(help="Checkpoint folder or run directory of an encoder model.")],
    text: Annotated[
        str | None, typer.Option(help="One input (default: lines of -i or stdin).", callback=as_sent)
    ] = None,
    input: Annotated[
        Path | None, typer.Option("-i", "--input", help="One input per line (default: stdin).")
    ] = None,
    output: OutputFile = None,
    precision: Precision = None,
    int8: Int8 = False,
    image: Annotated[
        list[Path] | None,
        typer.Option(help="An image file to caption (repeatable; PNG, JPEG): a captioner's input."),
    ] = None,
    audio: Annotated[
        list[Path] | None,
        typer.Option(help="A WAV file to transcribe (repeatable): a speech recogniser's input."),
    ] = None,
) -> None:
    """Run an encoder model on each input line. A classifier prints ``label<TAB>probability``; a
    question-answering model reads ``question<TAB>passage`` and prints the answer span; a masked-LM
    model fills each mask token of a sentence (``[MASK]`` or ``<mask>``, as its tokenizer writes it),
    printing ``token<TAB>probability`` for each. A captioner captions each --image, a speech recogniser
    transcribes each --audio, one line each. Extra ``decode.field=value`` arguments change the run's
    decoding settings (a captioner's or recogniser's), e.g. ``decode.beam_size=1``; a Transformer
    captioner's greedy search checks a smaller captioner's guesses with ``decode.speculative=RUN``."""
    from attnkit.processes import resolve_device
    from attnkit.task_records import encoder_heads
    from attnkit.tasks import task_of

    if text is not None and input is not None:
        raise AttnkitError("give --text TEXT or -i FILE, not both")
    if image and (text is not None or input is not None or audio):
        raise AttnkitError("give --image FILE (a captioner's input) or text or audio, not two of them")
    if audio and (text is not None or input is not None):
        raise AttnkitError("give --audio FILE (a speech recogniser's input) or text, not both")
    if output is not None:
        writable_file(output)
    if image or audio:
        read = _captions if image else _transcripts
        overrides = decode_overrides(ctx) + precision_override(precision, int8)
        rows = read(ckpt, image or audio, resolve_device(), overrides)
        write_output(output, "".join(row + "\n" for row in rows))
        return
    _not_a_captioner(ckpt)
    with processes(input if text is None else None) as world:
        device = resolve_device()
        overrides = decode_overrides(ctx) + precision_override(precision, int8)
        model, tokenizer, config = load_encoder(ckpt, encoder_heads(), device, overrides)
        task = task_of(config)
        if text is not None:
            rows = task.infer(model, tokenizer, config, [text], device, where="--text")
            write_output(output, "".join(row + "\n" for row in rows))
            return
        where = str(input or "stdin")

        def predict_part(lines: list[str], first: int, progress: Callable[[int], None]) -> list[str]:
            rows = task.infer(model, tokenizer, config, lines, device, where=where, first=first)
            progress(len(lines))
            return rows

        by_parts(input, output, predict_part, world)


def _captions(ckpt: Path, images: list[Path], device, overrides: list[str]) -> list[str]:
    """A captioner's caption of each image file (a one-line error names a file it cannot read, or
    whose size is not the model's)."""
    from attnkit.data.images import read_grey_images
    from attnkit.loading import load_for_inference
    from attnkit.tasks import task_of

    captioners = archs(reading="images", writing="text")
    model, tokenizer, config = load_for_inference(ckpt, device, arch=captioners, overrides=overrides)
    pixels = read_grey_images(images, config.model.image_size)
    return task_of(config).infer(model, tokenizer, config, pixels, device)


def _transcripts(ckpt: Path, sounds: list[Path], device, overrides: list[str]) -> list[str]:
    """A speech recogniser's transcript of each WAV file (a one-line error names a file it cannot
    read)."""
    from attnkit.data.audio import heard, read_wav
    from attnkit.loading import load_for_inference
    from attnkit.tasks import task_of

    recognisers = archs(reading="audio", writing="text")
    model, tokenizer, config = load_for_inference(ckpt, device, arch=recognisers, overrides=overrides)
    read = [read_wav(path) for path in sounds]  # every file checked before any is heard
    features = [heard(sound, config.model.sample_rate, config.model.n_mels) for sound in read]
    return task_of(config).infer(model, tokenizer, config, features, device)


def _not_a_captioner(ckpt: Path) -> None:
    """A one-line error for text given to a captioner or a speech recogniser, which read images and
    sound."""
    from attnkit.checkpoint.folder import read_run_config, resolve_checkpoint

    checkpoint = resolve_checkpoint(ckpt)
    arch = read_run_config(checkpoint).model.arch
    if arch in archs(reading="images", writing="text"):
        raise AttnkitError(f"{checkpoint}: a captioner reads images, not text: give --image FILE")
    if arch in archs(reading="audio", writing="text"):
        raise AttnkitError(f"{checkpoint}: a speech recogniser reads sound, not text: give --audio FILE.wav")
