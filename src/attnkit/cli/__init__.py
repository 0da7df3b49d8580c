"""The ``attnkit`` command line: a thin layer over the Python API, one module per group of commands
(``training``, ``decoding``, ``evaluating``, ``serving``, ``conversion``, ``tools``) on the shared parts
of ``app``."""

from __future__ import annotations

import importlib
import sys

import typer

from attnkit.cli.app import app, set_help
from attnkit.utf8 import use_utf8_streams

# each module adds its commands to app; --help lists them in this order
for group in ("training", "decoding", "evaluating", "serving", "conversion", "tools"):
    importlib.import_module(f"attnkit.cli.{group}")

__all__ = ["app", "main"]


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


set_help(app)
