"""Writes docs/cli.md, the command line's reference, from the commands themselves (what --help says):
``python docs/cli_reference.py > docs/cli.md``. tests/test_readme.py checks that the page is current."""

from __future__ import annotations

import typer.main

from attnkit.cli import app


def _default(param) -> str:
    if param.required:
        return "required"
    if getattr(param, "is_flag", False):
        return "off"
    default = param.default
    if default is None or callable(default):
        return ""
    return f"`{default}`"


def _names(param) -> str:
    if param.param_type_name == "argument":
        return f"`{param.name.upper()}`"
    return ", ".join(f"`{opt}`" for opt in (*param.opts, *param.secondary_opts))


def _command(name: str, command) -> list[str]:
    lines = [f"## `{name}`", "", (command.help or "").strip(), ""]
    params = [p for p in command.params if p.name != "help"]
    if params:
        lines += ["| argument or option | default | what it does |", "|---|---|---|"]
        for param in params:
            what = " ".join((getattr(param, "help", None) or "").split()).replace("|", "\\|")
            lines.append(f"| {_names(param)} | {_default(param)} | {what} |")
        lines.append("")
    return lines


def reference() -> str:
    root = typer.main.get_command(app)
    lines = ["# Command-line reference", "",
             "Every `attnkit` command with its arguments and options, as `attnkit COMMAND --help` shows them "
             "(this page is made from the commands: `python docs/cli_reference.py > docs/cli.md`).", "",
             (root.help or "").strip(), ""]  # fmt: skip
    for name, command in root.commands.items():
        if hasattr(command, "commands"):  # a group: attnkit data get, attnkit cache info
            for sub, subcommand in command.commands.items():
                lines += _command(f"attnkit {name} {sub}", subcommand)
        else:
            lines += _command(f"attnkit {name}", command)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(reference(), end="")
