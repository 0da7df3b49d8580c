"""``attnkit evaluate``: each kind of model scored on data it never trained on."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer

from attnkit.cli.app import (
    EXTRA_ARGS,
    Engine,
    Int8,
    app,
    at_least,
    decode_overrides,
    note,
    one_line_errors,
    progress_bar,
    writable_file,
)
from attnkit.cli.loading import (
    check_engine,
    ctranslate2_translator,
    load_encoder,
    load_translator,
    no_decoding,
)
from attnkit.errors import AttnkitError
from attnkit.models import ARCHITECTURES, archs
from attnkit.models.glimpse import GlimpseConfig


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
        _evaluate_exported(ckpt, src, ref, data, beam, overrides)
        return
    run_config = read_run_config(resolve_checkpoint(ckpt))
    with_decode_overrides(run_config.decode, overrides)  # checked before any work
    arch = run_config.model.arch
    scored_on = ARCHITECTURES[arch].scored_on
    if plot is not None and arch != GlimpseConfig.ARCH:
        raise AttnkitError(f"--plot draws a glimpse model's glimpses; {ckpt} holds {a_model(arch)}")
    if scored_on == "images":
        if data is not None or src is not None or ref is not None:
            raise AttnkitError(
                f"{ckpt} holds {a_model(arch)}: it is evaluated on its own generated test images"
            )
        no_decoding(overrides, int8, arch)
        _evaluate_images(ckpt, plot)
    elif scored_on == "labelled":
        if data is None or src is not None or ref is not None:
            raise AttnkitError(f"{ckpt} holds an encoder model: evaluate it with --data FILE.tsv")
        no_decoding(overrides, int8, arch)
        _evaluate_classifier(ckpt, data)
    elif scored_on == "text":
        if data is None or src is not None or ref is not None:
            raise AttnkitError(f"{ckpt} holds a decoder model: evaluate its perplexity with --data FILE.txt")
        no_decoding(overrides, False, arch)
        _evaluate_text(ckpt, data, int8, engine)
    elif run_config.data.task == "summarise":
        if data is None or src is not None or ref is not None:
            raise AttnkitError(f"{ckpt} holds a summariser: evaluate it with --data FILE.jsonl")
        _evaluate_summaries(ckpt, data, beam, overrides, int8)
    elif data is not None or src is None or ref is None:
        raise AttnkitError(f"{ckpt} holds {a_model(arch)}: evaluate it with --src FILE --ref FILE")
    else:
        _evaluate_translation(ckpt, src, ref, beam, overrides, engine, int8)


def _evaluate_exported(
    folder: Path,
    src: Path | None,
    ref: Path | None,
    data: Path | None,
    beam: int | None,
    overrides: list[str],
) -> None:
    """A CTranslate2 folder: a translation model's BLEU, or a decoder's perplexity."""
    if data is not None and src is None and ref is None:
        _evaluate_text(folder, data, False, "ctranslate2", overrides)
    elif data is not None or src is None or ref is None:
        raise AttnkitError("--engine ctranslate2 scores a translation model (--src FILE --ref FILE) or a "
                           "decoder's perplexity (--data FILE.txt)")  # fmt: skip
    else:
        _evaluate_translation(folder, src, ref, beam, overrides, "ctranslate2", False)


def _evaluate_translation(
    ckpt: Path, src: Path, ref: Path, beam: int | None, overrides: list[str], engine: str, int8: bool
) -> None:
    from attnkit.data.readers import read_parallel
    from attnkit.decode.translate import Reporting
    from attnkit.decode.translate import translate as translate_texts
    from attnkit.metrics import bleu, chrf
    from attnkit.processes import resolve_device

    pairs = read_parallel(src, ref, drop_empty=False)
    if engine == "ctranslate2":
        translator = ctranslate2_translator(ckpt, overrides)

        def run(texts: list[str], progress: Callable[[int], None]) -> list[str]:
            return translator.translate(texts, beam, progress)
    else:
        device = resolve_device()
        model, tokenizer, config = load_translator(ckpt, device, overrides, int8)

        def run(texts: list[str], progress: Callable[[int], None]) -> list[str]:
            return translate_texts(model, tokenizer, texts, config.decode, beam_size=beam, device=device,
                                   reporting=Reporting(note, progress))  # fmt: skip

    began = time.perf_counter()
    with progress_bar(len(pairs)) as bar:
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
    from attnkit.processes import resolve_device
    from attnkit.tasks.translation import cut_sources, read_summaries

    device = resolve_device()
    model, tokenizer, config = load_translator(ckpt, device, overrides, int8)
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


def _evaluate_text(ckpt: Path, data: Path, int8: bool, engine: str, overrides: Sequence[str] = ()) -> None:
    """A decoder's cross-entropy and perplexity on the text file ``data``, in blocks of its context: by
    attnkit (as training validates, ``train.max_tokens`` a batch) or by CTranslate2 (an exported folder,
    ``decode.batch_size`` blocks a batch)."""
    from attnkit.checkpoint import load_for_inference
    from attnkit.data.readers import read_text
    from attnkit.processes import resolve_device
    from attnkit.tasks.language_modelling import text_perplexity

    if engine == "ctranslate2":
        from attnkit.decode.ct2 import CTranslate2Generator

        generator = CTranslate2Generator(ckpt, overrides)
        scored, context = generator.perplexity(read_text(data)), generator.context
    else:
        device = resolve_device()
        model, tokenizer, config = load_for_inference(ckpt, device, arch=archs(using="generate"), int8=int8)
        per_batch = max(1, config.train.max_tokens // config.model.max_len)  # as training's validation
        scored = text_perplexity(model, tokenizer, read_text(data), per_batch, device)
        context = config.model.max_len
    typer.echo(f"perplexity = {scored['perplexity']:.3f} (cross-entropy {scored['loss']:.4f} nats per token, "
               f"{scored['tokens']:,} tokens predicted in blocks of {context})")  # fmt: skip


def _evaluate_classifier(ckpt: Path, data: Path) -> None:
    from attnkit.data.readers import read_labelled
    from attnkit.processes import resolve_device
    from attnkit.tasks.classification import score_classifier

    labelled = read_labelled(data)
    device = resolve_device()
    model, tokenizer, config = load_encoder(ckpt, ("classify",), device)
    began = time.perf_counter()
    accuracy, f1, correct = score_classifier(model, tokenizer, config.data.labels, labelled, data,
                                             config.decode.batch_size, device)  # fmt: skip
    seconds = time.perf_counter() - began
    typer.echo(f"accuracy {accuracy:.4f} ({correct}/{len(labelled)}), macro-F1 {f1:.4f}")
    typer.echo(f"{len(labelled)} sentences of {data} in {seconds:.1f} s")


def _evaluate_images(ckpt: Path, plot: Path | None) -> None:
    from attnkit.checkpoint import load_for_inference
    from attnkit.processes import resolve_device
    from attnkit.tasks.image_classification import accuracy, image_batch, split_canvases

    if plot is not None:
        writable_file(plot)
    device = resolve_device()
    model, _, config = load_for_inference(ckpt, device, arch=archs(reading="images"))
    test = split_canvases(config, "test")
    began = time.perf_counter()
    score = accuracy(model, test, config.train.batch_size, device)
    typer.echo(f"accuracy {score:.4f} on {len(test)} test images ({time.perf_counter() - began:.1f} s)")
    if plot is not None:
        from attnkit.viz.glimpses import plot_glimpse_paths

        batch = image_batch(test, list(range(min(8, len(test))))).to(device)
        typer.echo(f"glimpse paths: {plot_glimpse_paths(model, batch.images, batch.labels, plot)}")
