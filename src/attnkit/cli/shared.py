"""The ``attnkit`` command line's shared parts: the typer app, its options, one-line errors, input and
output, and help text that reads well on any terminal.

Errors a user can cause (``AttnkitError``, and typer's usage errors such as a missing option) are printed
as one line and exit with status 2. Every option's value is checked before any work starts, and every
output path is checked to be writable before hours of decoding, not after.
"""

from __future__ import annotations

import functools
import inspect
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from attnkit.errors import AttnkitError
from attnkit.utf8 import command_line_text

app = typer.Typer(add_completion=False, no_args_is_help=True)  # help: describe() below
EXTRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def as_sent(text: str | None) -> str | None:
    """A text option as the UTF-8 the terminal sent, whatever the locale (utf8.py)."""
    return None if text is None else command_line_text(text)


def _dash_is_standard_stream(path: Path | None) -> Path | None:
    """``-o -`` means stdout, as for most command-line tools (``-i -`` stdin: ``iter_lines``)."""
    return None if path is not None and str(path) == "-" else path


OutputFile = Annotated[
    Path | None,
    typer.Option("-o", "--output", help="Output file (default: stdout).", callback=_dash_is_standard_stream),
]
Int8 = Annotated[bool, typer.Option("--int8", help="The same as --precision int8.")]
Precision = Annotated[
    str | None,
    typer.Option(
        help="CPU: what the linear maps multiply in: bf16 (the processor's bf16 units; maps under 2^17 "
        "weights stay fp32, under 2^16 in compiled steps, and a model with no map of 2^17 runs fp32), "
        "int8 (weights and activations), fp32, or auto (bf16 where this CPU's bf16 products are fast). "
        "Default: the run's decode.precision (auto)."
    ),
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


def recipe_and_overrides(
    config: Path | None, args: list[str], data: Path | None
) -> tuple[Path | None, list[str]]:
    """A command's recipe and its ``section.field=value`` overrides: a first argument holding ``=`` that
    names no file is an override, not a recipe; ``--data DIR`` sets ``data.dir``."""
    if config is not None and "=" in config.name and not config.exists():
        config, args = None, [str(config), *args]
    return config, parse_overrides(args) + ([f"data.dir={data}"] if data else [])


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


def precision_override(precision: str | None, int8: bool) -> list[str]:
    """``--precision`` (or ``--int8``, its alias for int8) as a ``decode.precision`` override; none
    given, none."""
    if int8 and precision not in (None, "int8"):
        raise AttnkitError(f"--int8 means --precision int8; give one, not --precision {precision} too")
    chosen = "int8" if int8 else precision
    return [] if chosen is None else [f"decode.precision={chosen}"]


def write_output(output: Path | None, text: str) -> None:
    """``text`` to stdout, or to the file ``output`` written atomically (all of it or nothing)."""
    from attnkit.atomic import write_text_atomic

    if output is None:
        sys.stdout.write(text)
    else:
        write_text_atomic(output, text)


def stream_out(text: str) -> None:
    """Show ``text`` on stdout now, not when the buffer fills."""
    sys.stdout.write(text)
    sys.stdout.flush()


def note(message: str) -> None:
    typer.echo(f"attnkit: note: {message}", err=True)


@app.callback()
def describe() -> None:
    """attnkit: the Transformer of "Attention Is All You Need" and the attention family around it.

    A mistake (a missing file, a bad value, a malformed line) is reported in one line that names it, with
    exit status 2; options and output paths are checked before any work starts.

    On Linux every command runs on tcmalloc where the system has it (else jemalloc, else the system's
    malloc; 'apt-get install libtcmalloc-minimal4'), which made translation 1.19x and a bf16 training
    step 1.17x faster: the command restarts itself once with it preloaded, before anything loads, and
    the processes it starts get the environment it was given. ATTNKIT_ALLOCATOR=tcmalloc, jemalloc or
    system chooses (default auto); an allocator preloaded already is kept."""


def as_help(doc: Any) -> Any:
    """A docstring as typer should show it: each paragraph one line, which the terminal wraps (typer
    keeps the line breaks of every paragraph after the first, so a docstring's 110-column lines came out
    broken mid-sentence), and ``code`` quoted as 'code'."""
    if not isinstance(doc, str):  # None, or typer's placeholder for "not given"
        return doc
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs).replace("``", "'")


def set_help(typer_app: typer.Typer) -> None:
    typer_app.info.help = as_help(typer_app.info.help)
    if typer_app.registered_callback is not None:
        typer_app.registered_callback.help = as_help(typer_app.registered_callback.callback.__doc__)
    for command in typer_app.registered_commands:
        command.help = as_help(command.help or command.callback.__doc__)
    for group in typer_app.registered_groups:
        group.help = as_help(group.help)
        set_help(group.typer_instance)


def progress_bar(total: int | None = None, show: bool = True):
    """A progress bar of lines done, on stderr when it is a terminal (none in logs and pipes, nor
    where ``show`` is False: the processes but the first under torchrun)."""
    from tqdm import tqdm

    hidden = not (show and sys.stderr.isatty())
    return tqdm(total=total, disable=hidden, unit=" lines", dynamic_ncols=True, leave=False)
