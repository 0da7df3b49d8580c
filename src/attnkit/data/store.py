"""The prepared token store: a corpus's token ids, encoded once, kept in flat memory-mapped arrays.

Why: a run used to read every line into Python lists and tokenise everything again before its first
step, a resume too, and every process of a multi-process run did the same. A store is built by the
first run (or ``attnkit prepare``) and found again by every later run and every rank, so that start-up
reads a few small files and maps the rest; a process's memory then holds only the pages its batches
touch, which the processes of one machine share.

Layout of a store folder (one per key, under the store root):

- ``{column}.ids``: every row's token ids, one after another (``uint16`` where the vocabulary fits,
  ``uint32`` otherwise), mapped with ``numpy.memmap``;
- ``{column}.offsets.npy``: where each row starts, ``(rows + 1,)`` int64; a row's length is the
  difference of two neighbours, so the lengths batching needs cost nothing to read;
- ``tokenizer.json``: the tokenizer the ids are in;
- ``meta.json``, written last: the format, the columns, each file's size and SHA-256, and what the build
  reported (pairs dropped), so that a found store tells the run what a build would have.

The key is a hash of the inputs' identity (resolved path, size, modification time), the settings that
change the ids (tokenizer kind, vocabulary size, maximum length) and the store format: a changed file
or setting builds a new store. A store is written into a temporary folder beside its final place and
renamed into it whole (its files fsync'ed first, so that a crash cannot leave zero pages under a
complete-looking store), readable by whoever may read the store root, as checkpoints are; two
processes that build at once each finish, and the second finds the first's. A store whose files do not
match its ``meta.json`` (truncated, a file missing, ids or offsets changed in place) is rebuilt, with a
one-line note. A build stopped by SIGTERM (a cluster's time limit) removes its temporary folder; one
killed outright leaves it, named after its machine and process, and the next build on that machine
removes it once that process is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import random
import shutil
import signal
import socket
import tempfile
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from attnkit.atomic import fsync_dir, make_shareable
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import DataError

T = TypeVar("T")
FORMAT = 2  # bumped whenever the layout changes: older stores are then built again (2: the ids' SHA-256)


class StoreError(Exception):
    """A store folder whose files do not match its meta.json (the caller rebuilds it)."""


def store_root(setting: str = "") -> Path:
    """Where stores are kept: ``setting`` (``data.store``) if given, else ``$XDG_CACHE_HOME/attnkit/stores``
    (``~/.cache/attnkit/stores``), so that data folders may be read-only."""
    if setting:
        return Path(setting).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnkit" / "stores"


def store_key(inputs: Sequence[Path], settings: dict) -> str:
    """A name for the store of ``inputs`` encoded with ``settings``: changes when either does."""
    identity = []
    for path in inputs:
        stat = path.stat()
        identity.append([str(path.resolve()), stat.st_size, stat.st_mtime_ns])
    text = json.dumps({"format": FORMAT, "inputs": identity, "settings": settings}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class StoreColumn(Sequence):
    """One column of a store (the sources, say): ``column[i]`` is row i's ids as a list."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        self.ids, self.offsets = ids, offsets  # (tokens,) memory-mapped, (rows + 1,)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> list[int]:  # type: ignore[override]
        if not -len(self) <= i < len(self):
            raise IndexError(f"row {i} of {len(self)}")
        i %= len(self)
        return self.ids[self.offsets[i] : self.offsets[i + 1]].tolist()

    def lengths(self) -> np.ndarray:
        """Every row's length, ``(rows,)``, without reading a token."""
        return np.diff(self.offsets)

    def part(self, start: int, stop: int) -> StoreColumn:
        """Rows ``start`` to ``stop`` (excluded) as a column of their own, sharing the memory map."""
        return StoreColumn(self.ids, self.offsets[start : stop + 1])


@dataclass
class TokenStore:
    folder: Path
    tokenizer: Tokenizer
    columns: dict[str, StoreColumn]
    report: dict = field(default_factory=dict)  # what the build said (e.g. pairs dropped), from meta.json

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def open_store(folder: Path) -> TokenStore:
    """The store in ``folder``, its files checked against its meta.json (:class:`StoreError` if not)."""
    meta_path = folder / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise StoreError(f"meta.json unreadable ({error.__class__.__name__})") from None
    if meta.get("format") != FORMAT:
        raise StoreError(f"format {meta.get('format')}, this attnkit writes {FORMAT}")
    for name, size in meta["sizes"].items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            raise StoreError(f"{name} is missing or has another size than when it was written")
    for name, digest in meta["sha256"].items():  # a file changed in place keeps its size
        if _sha256(folder / name) != digest:
            raise StoreError(f"{name} changed since it was written")
    columns = {}
    for column in meta["columns"]:
        offsets = np.load(folder / f"{column}.offsets.npy", mmap_mode="r")  # shared by a machine's processes
        ids_path = folder / f"{column}.ids"
        dtype = np.dtype(meta["dtype"])
        if offsets[-1] * dtype.itemsize != ids_path.stat().st_size:
            raise StoreError(f"{ids_path.name} does not hold the tokens its offsets count")
        ids = np.memmap(ids_path, dtype=dtype, mode="r") if offsets[-1] else np.zeros(0, dtype)
        columns[column] = StoreColumn(ids, offsets)
    return TokenStore(folder, Tokenizer.load(folder / "tokenizer.json"), columns, meta.get("report", {}))


def write_store(
    folder: Path,
    tokenizer: Tokenizer,
    columns: Sequence[str],
    rows: Iterable[tuple[list[int], ...]],
    report: dict | None = None,
) -> TokenStore:
    """Write ``rows`` (one tuple of ids per row, one list per column; any iterable: they are streamed to
    disk a block at a time, never held whole) as the store ``folder``, atomically, and return it
    opened. ``report`` is saved as it is once the rows are used up, so the rows' producer may fill it.
    If another process wrote ``folder`` first, that store is returned."""
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32)
    work = Path(tempfile.mkdtemp(dir=writable_root(folder.parent), prefix=f".{folder.name}.{_builder()}."))
    with _removed_on_sigterm(work):
        outs = [(work / f"{name}.ids").open("wb") for name in columns]
        offsets = [array("q", [0]) for _ in columns]
        digests = {f"{name}.ids": hashlib.sha256() for name in columns}  # hashed as written, not read back
        try:
            for block in in_blocks(rows, 65536):
                for k, (out, digest) in enumerate(zip(outs, digests.values(), strict=True)):
                    column = [row[k] for row in block]
                    total = sum(map(len, column))
                    written = np.fromiter(itertools.chain.from_iterable(column), dtype, count=total).tobytes()
                    out.write(written)
                    digest.update(written)
                    start = offsets[k][-1]
                    offsets[k].extend(start + end for end in itertools.accumulate(map(len, column)))
            for out in outs:
                out.flush()
                os.fsync(out.fileno())
        finally:
            for out in outs:
                out.close()
        for name, ends in zip(columns, offsets, strict=True):
            np.save(work / f"{name}.offsets.npy", np.frombuffer(ends, dtype=np.int64))  # (rows + 1,)
        tokenizer.save(work / "tokenizer.json")
        files = sorted(work.iterdir())
        small = [path for path in files if path.name not in digests]  # the offsets and the tokenizer
        meta = {"format": FORMAT, "dtype": dtype.name, "columns": list(columns),
                "sizes": {path.name: path.stat().st_size for path in files},
                "sha256": {**{name: d.hexdigest() for name, d in digests.items()},
                           **{path.name: _sha256(path) for path in small}},
                "report": report or {}}  # fmt: skip
        (work / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        for path in work.iterdir():
            make_shareable(path)
            if path.name not in digests:  # the ids were synced as they closed
                with path.open("rb") as written:
                    os.fsync(written.fileno())
        make_shareable(work)
        fsync_dir(work)
        # a folder appears whole, or not at all; if another process put its store here first, it is
        # the same key's, the same store
        with contextlib.suppress(OSError):
            os.replace(work, folder)
            fsync_dir(folder.parent)
    return open_store(folder)


def writable_root(root: Path) -> Path:
    """``root``, made if missing; one line naming ``data.store`` where stores cannot be written there
    (read-only, or a file)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError as error:
        raise DataError(
            f"data.store {root}: cannot write token stores there ({error.strerror or error}); set "
            "data.store to a folder you can write"
        ) from None
    return root


def _builder() -> str:
    """Who builds a store: this machine and process, in its temporary folder's name (see
    :func:`sweep_abandoned`)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def sweep_abandoned(root: Path) -> None:
    """Remove the temporary folders of builds on this machine whose process is gone (killed outright:
    SIGKILL, a crash); those of other machines sharing the root, and of live processes, stay."""
    host = socket.gethostname()
    for path in root.glob(".*"):  # .KEY.HOST-PID.RANDOM (a host name may hold dots; a key does not)
        _key, _, rest = path.name[1:].partition(".")
        builder, _, _random = rest.rpartition(".")
        name, _, pid = builder.rpartition("-")
        if path.is_dir() and name == host and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def _removed_on_sigterm(work: Path) -> Iterator[None]:
    """``work`` removed when the block ends, however: an error, Ctrl-C, or SIGTERM (turned into an exit
    while the block runs, where nobody else handles it; a cluster's time limit sends it)."""
    handled = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if handled else None
    if handled and previous in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        yield
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if handled and previous in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, previous or signal.SIG_DFL)


def _exit_on_signal(number: int, frame: object) -> None:
    raise SystemExit(128 + number)


def uniform_sample(items: Iterable[T], size: int) -> list[T]:
    """Up to ``size`` of ``items``, streamed without holding them: all of a shorter stream, a uniform
    sample of a longer one (reservoir sampling, Vitter's algorithm R, seeded), in stream order. What a
    tokenizer learns from when a store is built from a corpus too large to hold."""
    rng, kept = random.Random(0), []  # (position, item)
    for n, item in enumerate(items):
        if n < size:
            kept.append((n, item))
        elif (k := rng.randrange(n + 1)) < size:
            kept[k] = (n, item)
    return [item for _, item in sorted(kept, key=lambda pair: pair[0])]


def in_blocks(rows: Iterable, size: int) -> Iterator[list]:
    """``rows`` in lists of ``size`` (the last one shorter)."""
    iterator = iter(rows)
    while block := list(itertools.islice(iterator, size)):
        yield block


def prepared(
    root: Path,
    inputs: Sequence[Path],
    settings: dict,
    tokenizer: Tokenizer | None,
    build: Callable[
        [Tokenizer | None], tuple[Tokenizer, Sequence[str], Iterable[tuple[list[int], ...]], dict]
    ],
    echo: Callable[[str], None],
) -> TokenStore:
    """The store of ``inputs`` with ``settings``: found under ``root``, or made by ``build(tokenizer)``
    (``-> (tokenizer, column names, rows, report)``: see :func:`write_store`) and written there.

    Without a tokenizer (a new run) the key is the inputs and settings, and the store brings the
    tokenizer its build learned. With one (a resumed or fine-tuned run), a store of the same key whose
    tokenizer is that one serves; otherwise the ids must be that tokenizer's, and the key includes it."""
    if root.is_dir():
        sweep_abandoned(root)
    base = root / store_key(inputs, settings)
    candidates = [base]
    if tokenizer is not None:
        tokenizer_sha = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
        candidates.append(root / store_key(inputs, {**settings, "tokenizer_sha256": tokenizer_sha}))
    for folder in candidates:
        if not folder.exists():
            continue
        try:
            store = open_store(folder)
        except StoreError as reason:
            echo(f"token store {folder}: {reason}; building it again")
            shutil.rmtree(folder, ignore_errors=True)
            continue
        if tokenizer is None or store.tokenizer.to_str() == tokenizer.to_str():
            echo(f"token store: {folder} ({len(store):,} rows, built before)")
            return store
    folder = candidates[-1]
    writable_root(root)  # before the build's work, not after it
    made_with, columns, rows, report = build(tokenizer)
    store = write_store(folder, made_with, columns, rows, report)
    echo(f"token store: {folder} ({len(store):,} rows, built now)")
    return store
