"""``attnkit evaluate``: each kind of model scored on data it never trained on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnkit.cli.loading import check_engine, ctranslate2_translator, no_decoding
from attnkit.cli.shared import (
    EXTRA_ARGS,
    Engine,
    Int8,
    Precision,
    app,
    at_least,
    decode_overrides,
    note,
    one_line_errors,
    precision_override,
    progress_bar,
    writable_file,
)
from attnkit.errors import AttnkitError
from attnkit.models import archs
from attnkit.models.glimpse import GlimpseConfig
from attnkit.tasks.protocol import Given


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
        Path | None,
        typer.Option(
            help="Glimpse model: save its glimpse paths on 8 test images; captioner: its attention, word by "
            "word, on 4 test scenes (PNG)."
        ),
    ] = None,
    precision: Precision = None,
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
    at_least("--beam", beam, 1)
    at_least("--streams", streams, 0)
    check_engine(engine, precision, int8)
    overrides = decode_overrides(ctx, streams) + precision_override(precision, int8)
    given = Given(src, ref, data, beam, progress_bar, note)
    if engine == "ctranslate2":  # an exported folder: a translation model, or a decoder's perplexity
        lines = _score_exported(ckpt, given, overrides)
    else:
        lines = _score(ckpt, given, overrides, plot)
    for line in lines:
        typer.echo(line)


def _score(ckpt: Path, given: Given, overrides: list[str], plot: Path | None) -> list[str]:
    """What the task of the run in ``ckpt`` scores its model on, checked, then scored (as the task says)."""
    from attnkit.checkpoint.folder import read_run_config, resolve_checkpoint
    from attnkit.config import with_decode_overrides
    from attnkit.loading import a_model, check_head, load_for_inference
    from attnkit.processes import resolve_device
    from attnkit.tasks import task_of

    checkpoint = resolve_checkpoint(ckpt)
    run_config = read_run_config(checkpoint)
    with_decode_overrides(run_config.decode, overrides)  # checked before any work
    arch, task = run_config.model.arch, task_of(run_config)
    scoring = task.scoring
    captioner = arch in archs(reading="images", writing="text")
    recogniser = arch in archs(reading="audio", writing="text")
    if plot is not None and not (captioner or recogniser or arch == GlimpseConfig.ARCH):
        drawn = "a glimpse model's glimpses, a captioner's attention or a speech recogniser's alignments"
        raise AttnkitError(f"--plot draws {drawn}; {ckpt} holds {a_model(arch)}")
    given_files = tuple(name for name in ("src", "ref", "data") if getattr(given, name) is not None)
    if given_files != scoring.files:
        raise AttnkitError(f"{ckpt} holds {scoring.holder or a_model(arch)}: {scoring.asks}")
    no_decoding([] if scoring.decodes else overrides, arch)
    if plot is not None:
        writable_file(plot)
    device = resolve_device()
    model, tokenizer, config = load_for_inference(checkpoint, device, overrides=overrides)
    if scoring.heads:
        check_head(ckpt, config, scoring.heads)
    lines = task.score(model, tokenizer, config, given, device)
    if plot is not None and captioner:
        lines.append(f"attention, word by word: {_plot_captions(model, tokenizer, config, plot, device)}")
    elif plot is not None and recogniser:
        lines.append(
            f"alignments over the spectrograms: {_plot_alignments(model, tokenizer, config, plot, device)}"
        )
    elif plot is not None:
        lines.append(f"glimpse paths: {_plot_glimpses(model, config, plot, device)}")
    return lines


def _score_exported(folder: Path, given: Given, overrides: list[str]) -> list[str]:
    """A CTranslate2 folder: a translation model's BLEU, or a decoder's perplexity."""
    from attnkit.tasks.language_modelling import perplexity_line
    from attnkit.tasks.translation import score_translations

    if given.data is not None and given.src is None and given.ref is None:
        from attnkit.data.readers import read_text
        from attnkit.decode.ct2 import CTranslate2Generator

        generator = CTranslate2Generator(folder, overrides)
        return [perplexity_line(generator.perplexity(read_text(given.data)), generator.context)]
    if given.data is not None or given.src is None or given.ref is None:
        raise AttnkitError(
            "--engine ctranslate2 scores a translation model (--src FILE --ref FILE) or a "
            "decoder's perplexity (--data FILE.txt)"
        )
    translator = ctranslate2_translator(folder, overrides)
    return score_translations(
        lambda texts, progress: translator.translate(texts, given.beam, progress), given
    )


def _plot_captions(model, tokenizer, config, plot: Path, device) -> Path:
    """A captioner's captions of the first 4 test scenes, each word over the attention that wrote it."""
    from attnkit.decode.captions import caption
    from attnkit.tasks.captioning import pixels, split_scenes
    from attnkit.viz.caption_strips import plot_caption_strips

    images = pixels(split_scenes(config, "test").images[:4]).to(device)
    return plot_caption_strips(
        model, tokenizer, images, caption(model, tokenizer, images, config.decode), plot
    )


def _plot_alignments(model, tokenizer, config, plot: Path, device) -> Path:
    """A speech recogniser's transcripts of the first 3 test utterances, each over its spectrogram."""
    from attnkit.decode.transcripts import transcribe
    from attnkit.tasks.speech import split_utterances
    from attnkit.viz.speech_alignments import plot_speech_alignments

    features = split_utterances(config, "test").features[:3]
    heard = transcribe(model, tokenizer, features, config.decode, device=device)
    return plot_speech_alignments(model, tokenizer, features, heard, plot, device)


def _plot_glimpses(model, config, plot: Path, device) -> Path:
    """A glimpse model's glimpse paths on the first 8 test images, drawn into ``plot``."""
    from attnkit.tasks.image_classification import image_batch, split_canvases
    from attnkit.viz.glimpses import plot_glimpse_paths

    test = split_canvases(config, "test")
    batch = image_batch(test, list(range(min(8, len(test))))).to(device)
    return plot_glimpse_paths(model, batch.images, batch.labels, plot)
