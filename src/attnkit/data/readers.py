"""Reading parallel text: one sentence per line, plain or gzip, source and target files aligned by line.

Bad input stops with a one-line :class:`DataError` naming the file (and line where there is one).
Pairs are filtered *together*: dropping an empty line from one side alone would shift every later
pair out of alignment (a bug JoeyNMT once had), so for training a pair is dropped when either side is
empty, and counted. For scoring, nothing is dropped: an empty source is translated as an empty line and
scored against its reference like every other line. A byte-order mark at the start of a file (what
Windows editors write before UTF-8) is not text and is dropped, as are line endings (LF or CRLF).
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from attnkit.errors import DataError

BYTE_ORDER_MARK = "\ufeff"  # U+FEFF at the start of a file: a marker some editors write, not text


def read_text(path: str | Path, allow_empty: bool = False) -> str:
    """A whole UTF-8 text file (``.gz`` is decompressed), line endings kept.

    An empty (or all-whitespace) file is an error unless ``allow_empty``; invalid UTF-8 is an error
    naming the line.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as error:
        raise DataError(f"{path}: cannot read ({error})") from None
    try:
        text = raw.decode("utf-8").removeprefix(BYTE_ORDER_MARK)
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1)
        raise DataError(f"{path}:{line}: invalid UTF-8 at byte {column} of the line") from None
    if not text.strip() and not allow_empty:
        raise DataError(f"{path}: file is empty")
    return text


def read_lines(path: str | Path, allow_empty: bool = False) -> list[str]:
    """The lines of a UTF-8 text file (``.gz`` is decompressed), without line endings (LF or CRLF).

    An empty file is an error unless ``allow_empty`` (text to translate: empty in, empty out).
    """
    lines = list(iter_lines(Path(path)))
    if not allow_empty and not any(line.strip() for line in lines):
        raise DataError(f"{path}: file is empty")
    return lines


def iter_lines(path: Path | None, keep_endings: bool = False) -> Iterator[str]:
    """The lines of a UTF-8 text file (``.gz`` is decompressed), or of standard input (``path`` None or
    ``-``), one at a time, without line endings (LF or CRLF; ``keep_endings``: with them, so that the
    lines put together are the text): an input of any size is read as it is used. Invalid UTF-8 is an
    error naming the line."""
    if path is None or str(path) == "-":
        yield from _decoded(sys.stdin.buffer, "<stdin>", keep_endings)
        return
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        with gzip.open(path) if path.suffix == ".gz" else path.open("rb") as f:
            yield from _decoded(f, str(path), keep_endings)
    except (OSError, EOFError) as error:  # a corrupt or truncated .gz, a failing disk
        raise DataError(f"{path}: cannot read ({error})") from None


def _decoded(lines: Iterable[bytes], name: str, keep_endings: bool = False) -> Iterator[str]:
    """Each line of ``lines`` (split at b"\\n" only, as files are) decoded, without its line ending
    unless ``keep_endings``."""
    for number, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(f"{name}:{number}: invalid UTF-8 at byte {error.start} of the line") from None
        if number == 1:
            line = line.removeprefix(BYTE_ORDER_MARK)
        yield line if keep_endings else line.removesuffix("\n").removesuffix("\r")


@dataclass
class ParallelText:
    """Aligned source/target sentences, and how many pairs were dropped as empty."""

    src: list[str]
    tgt: list[str]
    dropped_empty: int = 0
    references: list[list[str]] | None = None  # several references per source (summaries), if any

    def count_empty(self) -> tuple[int, int]:
        """How many kept pairs have an empty source, and how many an empty target."""
        return sum(not s for s in self.src), sum(not t for t in self.tgt)

    def __len__(self) -> int:
        return len(self.src)


def read_parallel(src_path: str | Path, tgt_path: str | Path, drop_empty: bool = True) -> ParallelText:
    """Read two aligned files (:func:`iter_pairs`, held): a line-count mismatch is an error giving both
    counts; ``drop_empty`` drops (and counts) pairs with an empty side, without it every pair is kept."""
    skipped: dict = {}
    pairs = list(iter_pairs(Path(src_path), Path(tgt_path), skipped, drop_empty))
    return ParallelText([s for s, _ in pairs], [t for _, t in pairs], skipped.get("dropped_empty", 0))


def iter_pairs(
    src_path: Path, tgt_path: Path, skipped: dict, drop_empty: bool = True
) -> Iterator[tuple[str, str]]:
    """The stripped line pairs of two aligned files, streamed, without holding them. With ``drop_empty``,
    pairs with an empty side are skipped and counted in ``skipped["dropped_empty"]``. A file without a
    non-empty line is an error, the source's first; so is a line-count mismatch, giving both counts."""
    seen = [False, False]  # a non-empty line in the source, in the target
    lines = (iter_lines(Path(src_path)), iter_lines(Path(tgt_path)))
    counts = [0, 0]
    for s, t in itertools.zip_longest(*lines):
        if s is None or t is None:  # one file ended: count the rest of the other
            longer = 0 if t is None else 1
            for line in itertools.chain([s if t is None else t], lines[longer]):
                counts[longer] += 1
                seen[longer] = seen[longer] or bool(line.strip())
            break
        counts[0], counts[1] = counts[0] + 1, counts[1] + 1
        s, t = s.strip(), t.strip()
        seen[0], seen[1] = seen[0] or bool(s), seen[1] or bool(t)
        if (s and t) or not drop_empty:
            yield s, t
        else:
            skipped["dropped_empty"] = skipped.get("dropped_empty", 0) + 1
    for path, any_line in zip((src_path, tgt_path), seen, strict=True):
        if not any_line:
            raise DataError(f"{path}: file is empty")
    if counts[0] != counts[1]:
        raise DataError(
            f"{src_path} has {counts[0]} lines but {tgt_path} has {counts[1]}: "
            "parallel files must align line by line"
        )


@dataclass
class LabelledText:
    """Sentences with a label each (classification data), and the file line each came from."""

    sentences: list[str]
    labels: list[str]
    lines: list[int]  # 1-based line numbers in the file, for errors that point at a line

    def __len__(self) -> int:
        return len(self.sentences)


def iter_labelled(path: str | Path) -> Iterator[tuple[str, str, int]]:
    """A TSV file of ``sentence<TAB>label`` lines (GLUE's SST-2 format), with an optional header line
    whose label field is ``label``, streamed: each line's ``(sentence, label, line number)``. The label
    is the text after the last tab, so a sentence may hold tabs; a line without a tab, or with an empty
    sentence or label, is an error naming the line, and so is a file without a labelled line."""
    labelled = False
    for number, line in enumerate(iter_lines(Path(path)), start=1):
        if not line.strip():
            continue  # blank lines (e.g. at the end of a file) carry nothing
        sentence, tab, label = line.rpartition("\t")
        if number == 1 and label.strip().lower() == "label":
            continue  # the header
        if not tab:
            raise DataError(f"{path}:{number}: no tab; a line is sentence<TAB>label")
        sentence, label = sentence.strip(), label.strip()
        if not sentence or not label:
            raise DataError(f"{path}:{number}: empty {'sentence' if not sentence else 'label'}")
        labelled = True
        yield sentence, label, number
    if not labelled:
        raise DataError(f"{path}: no labelled lines (sentence<TAB>label)")


def read_labelled(path: str | Path) -> LabelledText:
    """A whole file of :func:`iter_labelled` (small ones: validation sets, files to score)."""
    sentences, labels, numbers = zip(*iter_labelled(path), strict=True)
    return LabelledText(list(sentences), list(labels), list(numbers))


def iter_sentences(path: str | Path) -> Iterator[tuple[str, int]]:
    """Sentences and their line numbers, streamed: the sentence column of a ``sentence<TAB>label``
    TSV file (``.tsv``, ``.tsv.gz``; labels ignored), else every non-empty line; a file without a
    sentence is an error."""
    if str(path).removesuffix(".gz").endswith(".tsv"):
        for sentence, _, number in iter_labelled(path):
            yield sentence, number
        return
    found = False
    for number, line in enumerate(iter_lines(Path(path)), start=1):
        if line.strip():
            found = True
            yield line.strip(), number
    if not found:
        raise DataError(f"{path}: file is empty")


@dataclass
class Records:
    """Source texts and, per target field, their references from a JSON Lines file: one reference per
    record for training, several for evaluation (AESLC's dev set has three human subject lines)."""

    src: list[str]
    references: dict[str, list[list[str]]]  # target field -> each record's references

    def __len__(self) -> int:
        return len(self.src)


def iter_jsonl(path: str | Path, source_field: str, *target_fields: str) -> Iterator[tuple[str, dict]]:
    """The records of a JSON Lines file (gzip-compressed if it ends in .gz), streamed: each record's
    ``source_field`` text and, per target field, its references (a string, or a list of strings, in
    the file), stripped. A line that is not a JSON object, or lacks a field, is an error naming the
    file, the line and the field; a file without a record is an error."""
    any_record = False
    for number, line in enumerate(iter_lines(Path(path)), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{number}: not JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{number}: a line must be a JSON object, got {type(record).__name__}")
        for field in (source_field, *target_fields):
            if field not in record:
                raise DataError(f"{path}:{number}: no field {field!r} (fields: {', '.join(record)})")
        references = {}
        for field in target_fields:
            target = record[field]
            targets = [target] if isinstance(target, str) else target
            if not isinstance(record[source_field], str) or not (
                isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets)
            ):
                raise DataError(
                    f"{path}:{number}: {source_field!r} must be a string and {field!r} a string or a "
                    "non-empty list of strings"
                )
            references[field] = [t.strip() for t in targets]
        any_record = True
        yield record[source_field].strip(), references
    if not any_record:
        raise DataError(f"{path}: file is empty")


def read_jsonl(path: str | Path, source_field: str, *target_fields: str) -> Records:
    """:func:`iter_jsonl`'s records, held: the sources, and per target field each record's references."""
    sources, references = [], {field: [] for field in target_fields}
    for source, record_references in iter_jsonl(path, source_field, *target_fields):
        sources.append(source)
        for field, texts in record_references.items():
            references[field].append(texts)
    return Records(sources, references)


SEGMENT = re.compile(r"<seg id=\"?\d+\"?>\s*(.*?)\s*</seg>")


def segments(lines: Iterable[str]) -> list[str]:
    """The text of each ``<seg id="N">`` line of an evaluation set's XML or SGML file (IWSLT's, WMT's),
    in order, without the space around it."""
    return [match.group(1) for line in lines if (match := SEGMENT.search(line))]
