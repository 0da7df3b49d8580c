"""Folders attnkit writes (checkpoints, averages, exports, imports): whole or not at all, and never over
something they were not made to replace.

**Whole or not at all.** A folder is written under a hidden temporary name, every file fsync'ed, and
renamed into place in one step. Replacing an existing folder (the same step saved again, averaging
again) renames the old one aside first, renames the new one in, then deletes the old one; whoever reads
the folder next (:func:`recover`) puts an aside copy back if a kill came between the two renames.

**What made it.** Each folder records the command that wrote it and its source (the run averaged, the
checkpoint exported, the HF folder imported) in ``made_by.json``. A command replaces a folder only when
the folder is empty, or was made by the same command from the same source (``attnkit average`` run
again on the same run, the same checkpoint exported again) and holds nothing the new folder would not
write again. Anything else, a checkpoint, a run, another command's output, the user's own files, is
refused in one line that names the folder and what it holds, unless the command is given
``--overwrite``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnkit.atomic import fsync_dir, make_shareable
from attnkit.errors import AttnkitError

MADE_BY = "made_by.json"


@dataclass(frozen=True)
class MadeBy:
    """What wrote a folder: the command (``"attnkit average"``) and its source, a resolved path (empty
    for a model handed over in memory, by a Python caller)."""

    command: str
    source: str = ""

    @classmethod
    def of(cls, command: str, source: str | Path) -> MadeBy:
        return cls(command, str(Path(source).resolve()))

    def __str__(self) -> str:
        return f"{self.command} from {self.source}" if self.source else f"{self.command} (a model in memory)"


def _record(maker: MadeBy, folder: Path) -> str:
    """``made_by.json`` for ``folder``: the source relative to it, so that moving a run directory with
    its average (or an export with its checkpoint) keeps them each other's."""
    source = os.path.relpath(maker.source, folder.resolve()) if maker.source else ""
    return json.dumps({"command": maker.command, "source": source}, indent=2)


def made_by(folder: Path) -> MadeBy | None:
    """What wrote ``folder``, as its ``made_by.json`` says (None: no record, or not one of ours)."""
    try:
        record = json.loads((folder / MADE_BY).read_text(encoding="utf-8"))
        source = str(record["source"])
        return MadeBy(str(record["command"]), str((folder / source).resolve()) if source else "")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None


def what_it_holds(folder: Path) -> str:
    """``folder``'s content in a few words, for a refusal: a run, a checkpoint, a model, or files."""
    names = sorted(path.name + ("/" if path.is_dir() else "") for path in folder.iterdir())
    if any(name.startswith("step-") for name in names) or "last" in names:
        kind = "a run"
    elif "model.safetensors" in names and "config.json" in names:
        kind = "a model"
    elif "model.bin" in names:
        kind = "a CTranslate2 model"
    else:
        kind = "files"
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"{kind} ({shown})"


# --- writing a folder whole ---------------------------------------------------------------------------


def _aside(final: Path) -> Path:
    return final.with_name(f".{final.name}.replaced")


def recover(final: Path) -> None:
    """Finish a replacement of ``final`` that a killed process left half done: put the old copy back if
    the new one never arrived, or delete the old copy if it did."""
    aside = _aside(final)
    if aside.is_dir():
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(aside, final)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _publish(temporary: Path, final: Path) -> None:
    """Move a fully written temporary folder to ``final``: fsync its files, give it the user's usual
    permissions, rename an older ``final`` aside, rename the new one in, fsync the parent so the renames
    are durable, and only then delete the old copy."""
    for path in temporary.rglob("*"):  # a sharded checkpoint has folders inside
        if path.is_file():
            _fsync_file(path)
        else:
            fsync_dir(path)
    make_shareable(temporary)
    aside = _aside(final)
    if final.exists():  # e.g. the same step saved again, or averaging again
        os.replace(final, aside)
    os.replace(temporary, final)
    fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def refuse_replacing(final: Path, written: Path, maker: MadeBy, overwrite: bool = False) -> None:
    """Refuse to replace ``final`` by the folder ``written`` that ``maker`` made, by the rule above."""
    recover(final)
    if not final.exists():
        return
    if not final.is_dir():
        raise AttnkitError(f"{final} is a file; name a folder to write")
    if overwrite or not any(final.iterdir()):
        return
    earlier = made_by(final)
    if earlier != maker:
        whose = f"made by {earlier}" if earlier else "not written by attnkit"
        raise AttnkitError(
            f"{final} holds {what_it_holds(final)}, {whose}; name a new or empty folder, or pass "
            "--overwrite to replace it"
        )
    names = {path.name for path in written.iterdir()}
    for path in sorted(final.iterdir(), key=lambda path: (not path.is_dir(), path.name)):  # folders first
        if path.is_dir() or path.name not in names:
            held = f"{path.name}/" if path.is_dir() else path.name
            raise AttnkitError(
                f"{final} holds {held}, which writing there would delete; name a new or empty folder, "
                "or pass --overwrite to replace it"
            )


def new_temporary(final: Path) -> Path:
    """A new hidden folder beside ``final`` in which to write it (:func:`write_folder`)."""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    except OSError as error:
        raise AttnkitError(f"{final}: cannot write there ({error.strerror or error})") from None


def write_folder(
    final: Path,
    write: Callable[[Path], None],
    maker: MadeBy,
    *,
    overwrite: bool = False,
    temporary: Path | None = None,
) -> Path:
    """Write a folder (a checkpoint, an average, an export) with ``write(temporary_folder)``, record
    ``maker`` in it and publish it; what it will not replace without ``overwrite``: see the module
    docstring. A failure leaves no trace and is one line naming the folder. ``temporary``: a folder
    from :func:`new_temporary` that already holds part of it (the shards that every process of a
    sharded save wrote there)."""
    temporary = temporary or new_temporary(final)
    try:
        write(temporary)
        (temporary / MADE_BY).write_text(_record(maker, final), encoding="utf-8")
        refuse_replacing(final, temporary, maker, overwrite)
        _publish(temporary, final)
    except OSError as error:
        shutil.rmtree(temporary, ignore_errors=True)
        raise AttnkitError(f"{final}: cannot write there ({error.strerror or error})") from error
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return final
