"""``attnkit explore``, ``data get`` and ``cache``: the attention explorer, the standard data sets and
the compiled decoding steps' cache."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NamedTuple

import typer

from attnkit.cli.shared import app, as_sent, one_line_errors, writable_file
from attnkit.errors import AttnkitError
from attnkit.utf8 import native_path


@app.command()
@one_line_errors
def explore(
    ckpt: Annotated[
        list[Path],
        typer.Option(
            help="Checkpoint folder or run directory of a Transformer; of a captioner or speech "
            "recogniser, repeatable (side by side on --image or --audio)."
        ),
    ],
    text: Annotated[
        str, typer.Option(help="The sentence (source, prompt or text) to look at.", callback=as_sent)
    ] = "",
    target: Annotated[
        str | None,
        typer.Option(
            help="Encoder-decoder: the output to look at (default: its own translation).", callback=as_sent
        ),
    ] = None,
    image: Annotated[
        Path | None, typer.Option(help="Captioners: the image (PNG, JPEG) each one captions, word by word.")
    ] = None,
    audio: Annotated[
        Path | None,
        typer.Option(help="Speech recognisers: the WAV file each one transcribes, character by character."),
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
    alignment. Open it in any browser; it fetches nothing. --serve: type sentences in a local page.
    Captioners (--image): each one's caption of the image, each word over where it attended. Speech
    recognisers (--audio): the utterance's spectrogram, and each one's transcript, each character over
    the frames it attended."""
    from attnkit.atomic import write_text_atomic
    from attnkit.loading import load_for_inference
    from attnkit.viz import explorer as page

    if image is not None and audio is not None:
        raise AttnkitError("give --image (captioners) or --audio (speech recognisers), not both")
    reading = _reading(ckpt) | ({"images"} if image is not None else set()) | ({"audio"} if audio else set())
    if len(reading) > 1:
        raise AttnkitError(
            "--ckpt: captioners and speech recognisers read different things; explore one kind"
        )
    if reading:
        _explore_files(
            reading.pop(), ckpt, image if image is not None else audio, text, target, output, serve
        )
        return
    if len(ckpt) > 1:
        raise AttnkitError(
            "several --ckpt are for captioners on an --image or speech recognisers on --audio, side by side; "
            "give one model"
        )
    if not serve:
        writable_file(output)
    model, tokenizer, _ = load_for_inference(ckpt[0], "cpu")
    if serve:
        page.serve(model, tokenizer, native_path(ckpt[0]), text, port)
        return
    if not text.strip():
        raise AttnkitError("--text is empty: give a sentence to look at (or --serve to type them)")
    maps, translation = page.collect_attention(model, tokenizer, text, target)
    title = f"attention of {native_path(ckpt[0])} on: {text}"  # the page is UTF-8 text, whatever the locale
    write_text_atomic(output, page.explorer_html(maps, title, translation))
    layers, heads = len(maps[0].weights), len(maps[0].weights[0])
    typer.echo(f"{output}: {len(maps)} attention(s) × {layers} layers × {heads} heads; open it in a browser")


class FileReader(NamedTuple):
    """What ``explore`` says of the models that read a kind of file."""

    option: str  # the option naming the file
    model: str  # what such a model is
    models: str
    verb: str  # what it does with the file
    file: str  # what the file is


FILE_READERS = {
    "images": FileReader("--image", "a captioner", "captioners", "caption", "an image"),
    "audio": FileReader("--audio", "a speech recogniser", "speech recognisers", "transcribe", "an utterance"),
}


def _reading(ckpts: list[Path]) -> set[str]:
    """What the models of ``ckpts`` that read files read (``images``, ``audio``)."""
    from attnkit.checkpoint.folder import read_run_config, resolve_checkpoint
    from attnkit.models import archs

    arch_of = {c: read_run_config(resolve_checkpoint(c)).model.arch for c in ckpts}
    return {r for r in FILE_READERS for arch in arch_of.values() if arch in archs(reading=r, writing="text")}


def _explore_files(
    reading: str,
    ckpts: list[Path],
    file: Path | None,
    text: str,
    target: str | None,
    output: Path,
    serve: bool,
) -> None:
    """The caption explorer's page (each captioner of ``ckpts`` on an image) or the speech explorer's
    (each recogniser on an utterance), the models side by side."""
    from attnkit.atomic import write_text_atomic
    from attnkit.loading import load_for_inference
    from attnkit.models import archs

    kind = FILE_READERS[reading]
    if file is None:
        raise AttnkitError(f"{ckpts[0]} holds {kind.model}: give {kind.option} FILE to {kind.verb}")
    if text or target is not None or serve:
        raise AttnkitError(
            f"{kind.option} shows {kind.models} on {kind.file}; --text, --target and --serve are for "
            f"text models (attnkit serve serves {kind.model}'s explorer, with an upload, at /explore)"
        )
    writable_file(output)
    loaded = [load_for_inference(c, "cpu", arch=archs(reading=reading, writing="text")) for c in ckpts]
    names = [native_path(c) for c in ckpts]
    page, said = (_caption_page if reading == "images" else _speech_page)(loaded, names, file)
    write_text_atomic(output, page)
    typer.echo(f"{output}: {len(ckpts)} model(s) side by side; {said}")


def _caption_page(loaded: list, names: list[str], image: Path) -> tuple[str, str]:
    """The caption explorer's page of ``loaded`` captioners on ``image``, and what each wrote."""
    from attnkit.data.images import read_grey_images
    from attnkit.viz.caption_explorer import caption_page, caption_view

    views, pixels = [], None
    for (model, tokenizer, config), name in zip(loaded, names, strict=True):
        pixels = read_grey_images([image], config.model.image_size)[0]  # (H, W), of each model's size
        views.append(caption_view(model, tokenizer, config.decode, pixels, name))
    assert pixels is not None
    page = caption_page(pixels, views, f"captions of {native_path(image)}")
    return page, "each word over its attention; " + "; ".join(f"{v.name}: {v.caption}" for v in views)


def _speech_page(loaded: list, names: list[str], sound: Path) -> tuple[str, str]:
    """The speech explorer's page of ``loaded`` recognisers on the WAV file ``sound``, and what each
    heard."""
    from attnkit.data.audio import heard, read_wav
    from attnkit.viz.speech_explorer import speech_page, speech_view

    read = read_wav(sound)
    views, features = [], None
    for (model, tokenizer, config), name in zip(loaded, names, strict=True):
        features = heard(
            read, config.model.sample_rate, config.model.n_mels
        )  # (frames, n_mels), each model's
        views.append(speech_view(model, tokenizer, config.decode, features, name))
    assert features is not None
    page = speech_page(features, views, f"transcripts of {native_path(sound)}")
    return page, "each character over its alignment; " + "; ".join(f"{v.name}: {v.transcript}" for v in views)


data_app = typer.Typer(no_args_is_help=True, help="The standard data sets, laid out as the recipes expect.")
app.add_typer(data_app, name="data")


@data_app.command("get")
@one_line_errors
def data_get(
    name: Annotated[str, typer.Argument(help="multi30k, iwslt14, wmt14-en-de, sst2 or tinyshakespeare.")],
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
        "wmt14-en-de": "wmt14_en_de_base",
        "sst2": "sst2_from_scratch",
        "tinyshakespeare": "shakespeare_char",
    }
    typer.echo(f"ready: attnkit train configs/{recipe[name]}.yaml --data {folder} --run-dir runs/{name}")


cache_app = typer.Typer(no_args_is_help=True, help="The compiled decoding steps that decode.steps keeps.")
app.add_typer(cache_app, name="cache")


@cache_app.command("info")
@one_line_errors
def cache_info() -> None:
    """Where the compiled steps are kept, how many, and how much room they take (at most 2 GiB: beyond
    that, and after 30 days unused, steps are deleted)."""
    from attnkit.cpu.compiled.cache import cache_folder, cached_steps

    steps = cached_steps()
    size = sum(bytes_ for _, bytes_, _ in steps)
    typer.echo(f"{cache_folder()}: {len(steps)} compiled step(s), {size / 2**20:.1f} MiB")


@cache_app.command("clear")
@one_line_errors
def cache_clear() -> None:
    """Delete every compiled step (each is compiled again when next needed)."""
    from attnkit.cpu.compiled.cache import cache_folder, cached_steps, remove_step

    steps = cached_steps()
    for package, _, _ in steps:
        remove_step(package)
    size = sum(bytes_ for _, bytes_, _ in steps)
    typer.echo(f"{cache_folder()}: deleted {len(steps)} compiled step(s), {size / 2**20:.1f} MiB")
