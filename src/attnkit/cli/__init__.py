"""The ``attnkit`` command line: a thin layer over the Python API, one module per group of commands
(``training``, ``decoding``, ``evaluating``, ``serving``, ``conversion``, ``tools``) on the parts they
share (``shared``: the typer app, options, one-line errors).

:func:`program` is the command itself: it restarts on a faster memory allocator before anything loads
torch (``attnkit.cpu.allocator``), then runs :func:`main`; so this package imports the commands (and
with them torch) only when ``app`` or ``main`` is used.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import TYPE_CHECKING, Any

__all__ = ["app", "main", "program"]

if TYPE_CHECKING:
    import typer

    app: typer.Typer


@functools.cache
def _app() -> Any:
    """The command line's typer app, with every group's commands added (--help lists them in this order)."""
    from attnkit.cli.shared import app, set_help

    for group in ("training", "decoding", "evaluating", "serving", "conversion", "tools"):
        importlib.import_module(f"attnkit.cli.{group}")
    set_help(app)
    return app


def program() -> None:
    """The ``attnkit`` program (and ``python -m attnkit``): on the allocator that ``ATTNKIT_ALLOCATOR``
    names (tcmalloc where the system has it), then :func:`main`."""
    from attnkit.cpu.allocator import AllocatorNotFoundError, restart_on_allocator

    try:
        restart_on_allocator()
    except AllocatorNotFoundError as error:
        print(f"attnkit: error: {error}", file=sys.stderr)
        sys.exit(2)
    main()


def main() -> None:
    """Runs the command line in this process, printing typer's usage errors as one line too."""
    import typer

    from attnkit.utf8 import use_utf8_streams

    use_utf8_streams()
    if len(sys.argv) <= 1:
        sys.argv.append("--help")
    try:
        code = _app()(standalone_mode=False)
    except typer.Abort:
        sys.exit(130)
    except typer.TyperException as error:  # a usage error: missing option, bad value, unknown command
        context = getattr(error, "ctx", None)
        hint = f" (try '{context.command_path} --help')" if context is not None else ""
        typer.echo(f"attnkit: error: {error.format_message()}{hint}", err=True)
        sys.exit(getattr(error, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)


def __getattr__(name: str) -> Any:
    if name == "app":
        return _app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
