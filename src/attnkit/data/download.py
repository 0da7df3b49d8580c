"""Fetching the standard data sets: ``attnkit data get multi30k DIR``.

Each data set is a list of files, each with the address it is published at (a fixed commit, so the bytes
never change) and its SHA-256 (an MD5 for IWSLT14's archive: the only checksum of it on public record).
A file is downloaded into ``NAME.part`` beside its final place, with a progress bar; a broken download is
resumed where it stopped (an HTTP ``Range`` request) the next time the same command runs; the finished
file is checked against its checksum and only then renamed into place, so a file with its final name is
always complete and right. A file already there with the right checksum is not fetched again. Errors are
one line naming the file: the server's refusal, a connection that broke off (run the command again to
resume), a checksum that does not match (the partial file is deleted, as resuming it would keep the
damage).

``mirror`` replaces the publishers' addresses with ``MIRROR/<data set>/<file name>``: for a local copy,
an internal server, or the tests (which serve files from 127.0.0.1).

IWSLT14 de-en comes as one archive (fairseq's copy of the 2014 release), which :func:`prepare_iwslt14`
then lays out as fairseq's ``prepare-iwslt14.sh`` does, without its tokenising and lower-casing (attnkit's
BPE reads raw text): ``train``/``valid`` from the TED training transcripts (every 23rd pair to
``valid``), ``test`` from the dev2010, TEDX dev2012 and tst2010-2012 sets.
"""

from __future__ import annotations

import hashlib
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path

from tqdm import tqdm

from attnkit.atomic import LINK_REFUSED, open_own, write_text_atomic
from attnkit.data.readers import segments
from attnkit.data.wmt14 import prepare_wmt14
from attnkit.errors import DataError

CHUNK = 1 << 16


@dataclass(frozen=True)
class DataFile:
    name: str  # where it goes, relative to the data set's folder
    url: str
    digest: str  # hexadecimal
    algorithm: str = "sha256"  # a hashlib name


ALGORITHM_NAMES = {"sha256": "SHA-256", "sha1": "SHA-1", "md5": "MD5"}


MULTI30K = "https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw"
SST2 = "https://raw.githubusercontent.com/eyalbd2/Reproducing-AutoPrompt/6288fb5bec9c572f2492875ae0111df5b6daed11/glue_data/SST-2"
CHAR_RNN = "https://raw.githubusercontent.com/karpathy/char-rnn/6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e/data"
IWSLT14 = "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14"  # fairseq's prepare-iwslt14.sh fetches it
STATMT = "https://www.statmt.org"  # WMT's publisher, which gives no checksums: GluonNLP's SHA-1 (training
# archives) and sacreBLEU's MD5 (test sets) of the files they fetch from there

# The layout each recipe expects (docs/data.md); checksums of the published bytes.
DATASETS: dict[str, list[DataFile]] = {
    "multi30k": [
        DataFile(name, f"{MULTI30K}/{name}", sha256)
        for name, sha256 in (
            ("train.de.gz", "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6"),
            ("train.en.gz", "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f"),
            ("val.de.gz", "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a"),
            ("val.en.gz", "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28"),
            ("test_2016_flickr.de.gz", "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8"),
            ("test_2016_flickr.en.gz", "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9"),
        )
    ],
    "sst2": [
        DataFile(
            "train.tsv",
            f"{SST2}/train_full.tsv",
            "48eac26399f8456935f81dd9e3a745c1430adb6c62e233ccfe22db4a0d15d1d1",
        ),
        DataFile(
            "dev.tsv", f"{SST2}/dev.tsv", "54a9c12c77e402fc14d6a66a506f24d999f596b0176eb777c972cccc2f9cc4b0"
        ),
    ],
    "tinyshakespeare": [
        DataFile(
            "input.txt",
            f"{CHAR_RNN}/tinyshakespeare/input.txt",
            "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        ),
    ],
    "iwslt14": [DataFile("de-en.tgz", f"{IWSLT14}/de-en.tgz", "10936dfdf616504ddbd844e91b94ef4a", "md5")],
    "wmt14-en-de": [
        DataFile(name, url, digest, algorithm)
        for name, url, digest, algorithm in (
            (
                "de-en.tgz",
                f"{STATMT}/europarl/v7/de-en.tgz",
                "53bb5408d22977c89284bd755717e6bbb5b12bc5",
                "sha1",
            ),
            (
                "training-parallel-commoncrawl.tgz",
                f"{STATMT}/wmt13/training-parallel-commoncrawl.tgz",
                "1c0ad85f0ebaf1d543acb009607205f5dae6627d",
                "sha1",
            ),
            (
                "training-parallel-nc-v9.tgz",
                f"{STATMT}/wmt14/training-parallel-nc-v9.tgz",
                "c7ae7f50cd45c2f3014d78ddba25a4a8a851e27a",
                "sha1",
            ),
            ("test.tgz", f"{STATMT}/wmt13/test.tgz", "48eca5d02f637af44e85186847141f67", "md5"),
            ("test-full.tgz", f"{STATMT}/wmt14/test-full.tgz", "a8cd784e006feb32ac6f3d9ec7eb389a", "md5"),
        )
    ],
}


def digest_of(path: Path, algorithm: str = "sha256") -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def get_dataset(name: str, folder: Path, mirror: str | None = None, progress: bool = True) -> list[Path]:
    """Download data set ``name`` into ``folder`` (made if needed); returns the files' paths."""
    if name not in DATASETS:
        raise DataError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file of that name, no permission, ...
        raise DataError(f"{folder}: cannot make the folder ({error.strerror or error})") from None
    paths = []
    for file in DATASETS[name]:
        url = f"{mirror.rstrip('/')}/{name}/{file.name}" if mirror else file.url
        paths.append(fetch(DataFile(file.name, url, file.digest, file.algorithm), folder, progress))
    if name == "iwslt14":
        paths += prepare_iwslt14(paths[0], folder)
    if name == "wmt14-en-de":
        paths += prepare_wmt14(folder)
    return paths


def fetch(file: DataFile, folder: Path, progress: bool = True) -> Path:
    """``folder / file.name``, downloaded (or resumed) and checked unless it is there already."""
    final, partial = folder / file.name, folder / (file.name + ".part")
    if final.exists():  # attnkit renames a download into place only once checked: this one is not ours
        if digest_of(final, file.algorithm) == file.digest:
            return final
        algorithm = ALGORITHM_NAMES[file.algorithm]
        raise DataError(
            f"{final}: already there, and not the file the data set has (its {algorithm} differs); move it "
            "away, or get the data set into another folder"
        )
    if partial.is_symlink():
        raise DataError(f"{partial}: {LINK_REFUSED}")
    have = partial.stat().st_size if partial.exists() else 0
    total = None  # bytes the file should have, when the server says
    request = urllib.request.Request(file.url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            if have and response.status != 206:  # the server ignored the range: start again
                have = 0
            length = response.headers.get("Content-Length")
            total = have + int(length) if length is not None else None
            with open_own(partial, "ab" if have else "wb") as out, tqdm(
                total=total, initial=have, unit="B", unit_scale=True, desc=file.name, disable=not progress,
                leave=False,
            ) as bar:  # fmt: skip
                for chunk in iter(lambda: response.read(CHUNK), b""):
                    out.write(chunk)
                    bar.update(len(chunk))
    except urllib.error.HTTPError as error:
        if error.code != 416 or not have:  # 416 to a resumed request: nothing left, the part is whole
            raise DataError(f"{file.name}: {file.url} answered {error.code} {error.reason}") from None
    except (urllib.error.URLError, HTTPException, OSError) as error:
        got = partial.stat().st_size if partial.exists() else 0
        reason = getattr(error, "reason", None) or error
        if not got:
            raise DataError(f"{file.name}: cannot download {file.url} ({reason})") from None
        raise DataError(
            f"{file.name}: the download broke off after {got:,} bytes ({reason}); run the same command "
            "again to resume it"
        ) from None
    got = partial.stat().st_size
    if total is not None and got < total:
        raise DataError(
            f"{file.name}: the download broke off after {got:,} of {total:,} bytes; run the same command "
            "again to resume it"
        )
    digest = digest_of(partial, file.algorithm)
    if digest != file.digest:
        partial.unlink()
        raise DataError(
            f"{file.name}: {ALGORITHM_NAMES[file.algorithm]} {digest} is not the expected {file.digest} "
            f"(from {file.url}); the partial file was deleted"
        )
    partial.replace(final)
    return final


# fairseq's prepare-iwslt14.sh: the test set, and the training transcripts' lines that are not sentences
IWSLT14_TEST = ["IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
                "IWSLT14.TED.tst2012"]  # fmt: skip
IWSLT14_NOT_TEXT = ("<url>", "<talkid>", "<keywords>")


def prepare_iwslt14(archive: Path, folder: Path) -> list[Path]:
    """``train``, ``valid`` and ``test`` ``.de``/``.en`` in ``folder`` from fairseq's IWSLT14 archive,
    as its ``prepare-iwslt14.sh`` makes them but untokenised and with their case: the training
    transcripts without the lines holding ``<url>``, ``<talkid>`` or ``<keywords>``, the ``<title>`` and
    ``<description>`` tags removed (their text stays), pairs dropped as its cleaning step drops them
    (a side empty or over 175 words, or one side over 1.5 times as many words as the other; fairseq
    counts Moses tokens, attnkit words), every 23rd pair to ``valid``; ``test`` the ``<seg>`` lines of
    the five evaluation sets, ’ read as '. Each file is written whole or not at all."""
    try:
        with tarfile.open(archive) as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}

            def read(name: str) -> list[str]:
                if name not in members:
                    raise DataError(f"{archive}: the archive has no {name} (is it IWSLT14's de-en.tgz?)")
                return tar.extractfile(members[name]).read().decode("utf-8").splitlines()

            train = {lang: read(f"train.tags.de-en.{lang}") for lang in ("de", "en")}
            test = {lang: [s.replace("\u2019", "'") for s in
                           segments(line for t in IWSLT14_TEST for line in read(f"{t}.de-en.{lang}.xml"))]
                    for lang in ("de", "en")}  # fmt: skip
    except (tarfile.TarError, OSError, EOFError, UnicodeDecodeError) as error:
        raise DataError(f"{archive}: not a readable IWSLT14 .tgz archive ({error})") from None
    for name, sides in (("train.tags.de-en", train), ("the test sets' <seg> lines", test)):
        if len(sides["de"]) != len(sides["en"]):
            counts = f"{len(sides['de'])} German and {len(sides['en'])} English lines"
            raise DataError(f"{archive}: {name} has {counts}")
    lines = zip(train["de"], train["en"], strict=True)
    pairs = [(_text(de), _text(en)) for de, en in lines if not _not_text(de) and not _not_text(en)]
    pairs = [(de, en) for de, en in pairs if _clean_pair(de, en)]
    splits = {
        "train": [pair for i, pair in enumerate(pairs, 1) if i % 23 != 0],
        "valid": [pair for i, pair in enumerate(pairs, 1) if i % 23 == 0],
        "test": list(zip(test["de"], test["en"], strict=True)),
    }
    texts = {
        folder / f"{split}.{lang}": "".join(row[side] + "\n" for row in rows)
        for split, rows in splits.items()
        for side, lang in enumerate(("de", "en"))
    }
    for path, text in texts.items():  # all checked before any is written
        if path.exists() and path.read_bytes() != text.encode("utf-8"):
            raise DataError(
                f"{path}: already there, and not what attnkit makes of {archive.name}; move it away, or get "
                "the data set into another folder"
            )
    for path, text in texts.items():
        write_text_atomic(path, text)
    return list(texts)


def _not_text(line: str) -> bool:
    return any(tag in line for tag in IWSLT14_NOT_TEXT)  # grep -v, as the script filters them


def _text(line: str) -> str:
    for tag in ("<title>", "</title>", "<description>", "</description>"):
        line = line.replace(tag, "")
    return line.strip()


def _clean_pair(de: str, en: str) -> bool:
    """fairseq's ``clean-corpus-n.perl -ratio 1.5 ... 1 175`` on words."""
    a, b = len(de.split()), len(en.split())
    return 1 <= a <= 175 and 1 <= b <= 175 and a <= 1.5 * b and b <= 1.5 * a
