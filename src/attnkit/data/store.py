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
- ``meta.json``, written last: the format, the columns, each file's size and the offsets' SHA-256, and
  what the build reported (pairs dropped), so that a found store tells the run what a build would have.

The key is a hash of the inputs' identity (resolved path, size, modification time), the settings that
change the ids (tokenizer kind, vocabulary size, maximum length) and the store format: a changed file
or setting builds a new store. A store is written into a temporary folder beside its final place and
renamed into it whole, so no reader sees half of one; two processes that build at once each finish,
and the second finds the first's. A store whose files do not match its ``meta.json`` (truncated, a
file missing, offsets changed) is rebuilt, with a one-line note.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import random
import shutil
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from attnkit.data.tokenizer import Tokenizer

T = TypeVar("T")
FORMAT = 1  # bumped whenever the layout changes: older stores are then built again


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
    columns = {}
    for column in meta["columns"]:
        offsets_path = folder / f"{column}.offsets.npy"
        if _sha256(offsets_path) != meta["offsets_sha256"][column]:
            raise StoreError(f"{offsets_path.name} changed since it was written")
        offsets = np.load(offsets_path, mmap_mode="r")  # shared by the processes of a machine, as the ids
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
    folder.parent.mkdir(parents=True, exist_ok=True)
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32)
    work = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        outs = [(work / f"{name}.ids").open("wb") for name in columns]
        offsets = [array("q", [0]) for _ in columns]
        try:
            for block in in_blocks(rows, 65536):
                for k, out in enumerate(outs):
                    column = [row[k] for row in block]
                    total = sum(map(len, column))
                    out.write(
                        np.fromiter(itertools.chain.from_iterable(column), dtype, count=total).tobytes()
                    )
                    start = offsets[k][-1]
                    offsets[k].extend(start + end for end in itertools.accumulate(map(len, column)))
        finally:
            for out in outs:
                out.close()
        meta = {"format": FORMAT, "dtype": dtype.name, "columns": list(columns), "sizes": {},
                "offsets_sha256": {}, "report": report or {}}  # fmt: skip
        for name, ends in zip(columns, offsets, strict=True):
            np.save(work / f"{name}.offsets.npy", np.frombuffer(ends, dtype=np.int64))  # (rows + 1,)
            meta["offsets_sha256"][name] = _sha256(work / f"{name}.offsets.npy")
        tokenizer.save(work / "tokenizer.json")
        for path in work.iterdir():
            meta["sizes"][path.name] = path.stat().st_size
        (work / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        # a folder appears whole, or not at all; if another process put its store here first, it is
        # the same key's, the same store
        with contextlib.suppress(OSError):
            os.replace(work, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return open_store(folder)


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
    made_with, columns, rows, report = build(tokenizer)
    store = write_store(folder, made_with, columns, rows, report)
    echo(f"token store: {folder} ({len(store):,} rows, built now)")
    return store
