"""WMT 2014 English-German as the paper trained on it: ``attnkit data get wmt14-en-de DIR``.

The paper's "standard WMT 2014 English-German dataset consisting of about 4.5 million sentence pairs"
is the shared task's three parallel corpora for German-English: Europarl v7 (1.92 M pairs), Common
Crawl (2.40 M) and News Commentary v9 (0.20 M), 4.52 M in all. Validation is newstest2013 and the test
newstest2014 (the full set of 3,003 sentences that sacreBLEU's ``wmt14/full`` scores; the paper's
Table 2 reports it).

:func:`prepare_wmt14` lays the downloaded archives out as the recipe ``configs/wmt14_en_de_base.yaml``
reads them, raw (attnkit's BPE reads untokenised text, so no Moses scripts):

- ``train.en``/``train.de``: the three corpora one after another, each checked to have as many English
  as German lines; streamed from the archives, never held in memory;
- ``valid.en``/``valid.de``: newstest2013's ``<seg>`` lines; ``test.en``/``test.de``: newstest2014's.

Every file is written beside its place and renamed in whole; a file already there that is not what
this makes is never replaced.
"""

from __future__ import annotations

import filecmp
import os
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from attnkit.atomic import open_own, write_text_atomic
from attnkit.data.readers import segments
from attnkit.errors import DataError

# (archive, the base name of its German and English files, without the language): the paper's 4.5M pairs
TRAINING = [
    ("de-en.tgz", "europarl-v7.de-en"),
    ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en"),
    ("training-parallel-nc-v9.tgz", "news-commentary-v9.de-en"),
]
# (archive, its English and German SGML files)
VALID = ("test.tgz", {"en": "newstest2013-src.en.sgm", "de": "newstest2013-src.de.sgm"})
TEST = ("test-full.tgz", {"en": "newstest2014-deen-src.en.sgm", "de": "newstest2014-deen-ref.de.sgm"})
LANGUAGES = ("en", "de")


def prepare_wmt14(folder: Path) -> list[Path]:
    """``train``, ``valid`` and ``test`` ``.en``/``.de`` in ``folder``, from the archives there."""
    try:
        made = []
        for split, (archive, names) in (("valid", VALID), ("test", TEST)):
            texts = _sgm_pair(folder / archive, names)
            for lang in LANGUAGES:
                made.append(_write_new(folder / f"{split}.{lang}", texts[lang], archive))
        return made + _training_files(folder)
    except (tarfile.TarError, EOFError, zlib.error, UnicodeDecodeError) as error:  # checked, yet damaged
        raise DataError(f"{folder}: a WMT14 archive there cannot be read ({error})") from None


def _members(archive: Path) -> Iterator[tuple[str, tarfile.TarFile, tarfile.TarInfo]]:
    """Each file in ``archive`` by its base name (archives nest their files differently)."""
    try:
        with tarfile.open(archive) as tar:
            for member in tar:
                if member.isfile():
                    yield Path(member.name).name, tar, member
    except (tarfile.TarError, OSError, EOFError) as error:
        raise DataError(f"{archive}: not a readable .tgz archive ({error})") from None


def _sgm_pair(archive: Path, names: dict[str, str]) -> dict[str, str]:
    """The ``<seg>`` lines of the English and German SGML files ``names`` in ``archive``, as text."""
    found = {}
    for name, tar, member in _members(archive):
        for lang, wanted in names.items():
            if name == wanted:
                lines = tar.extractfile(member).read().decode("utf-8").splitlines()
                found[lang] = segments(lines)
    for lang in LANGUAGES:
        if lang not in found:
            raise DataError(
                f"{archive}: the archive has no {names[lang]} (is it the WMT archive {archive.name}?)"
            )
    if len(found["en"]) != len(found["de"]):
        raise DataError(f"{archive}: {len(found['en'])} English and {len(found['de'])} German segments")
    return {lang: "".join(line + "\n" for line in found[lang]) for lang in LANGUAGES}


def _write_new(path: Path, text: str, source: str) -> Path:
    if path.exists() and path.read_bytes() != text.encode("utf-8"):
        raise DataError(
            f"{path}: already there, and not what attnkit makes of {source}; move it away, or get the data "
            "set into another folder"
        )
    write_text_atomic(path, text)
    return path


def _training_files(folder: Path) -> list[Path]:
    """``train.en`` and ``train.de``: each corpus's files streamed from its archive into ``.part`` files,
    counted, and renamed into place once all are in and every corpus has as many lines on each side."""
    finals = {lang: folder / f"train.{lang}" for lang in LANGUAGES}
    parts = {lang: folder / f"train.{lang}.part" for lang in LANGUAGES}
    try:
        with open_own(parts["en"], "wb") as en, open_own(parts["de"], "wb") as de:
            outs = {"en": en, "de": de}
            for archive, stem in TRAINING:
                counts = {}
                for name, tar, member in _members(folder / archive):
                    for lang in LANGUAGES:
                        if name == f"{stem}.{lang}":
                            counts[lang] = _copy_lines(tar.extractfile(member), outs[lang])
                for lang in LANGUAGES:
                    if lang not in counts:
                        raise DataError(f"{folder / archive}: the archive has no {stem}.{lang}")
                if counts["en"] != counts["de"]:
                    sides = f"{counts['en']:,} English and {counts['de']:,} German lines"
                    raise DataError(f"{folder / archive}: {stem} has {sides}")
        for lang in LANGUAGES:
            if finals[lang].exists() and not filecmp.cmp(finals[lang], parts[lang], shallow=False):
                raise DataError(
                    f"{finals[lang]}: already there, and not what attnkit makes of the WMT14 archives; move "
                    "it away, or get the data set into another folder"
                )
        for lang in LANGUAGES:
            os.replace(parts[lang], finals[lang])
    finally:
        for part in parts.values():
            part.unlink(missing_ok=True)
    return list(finals.values())


def _copy_lines(source, out) -> int:
    """Copy ``source`` to ``out`` a megabyte at a time, ending it with a newline; returns its lines."""
    lines, last = 0, b"\n"
    for block in iter(lambda: source.read(1 << 20), b""):
        out.write(block)
        lines += block.count(b"\n")
        last = block[-1:]
    if last != b"\n":
        out.write(b"\n")
        lines += 1
    return lines
