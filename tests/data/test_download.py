"""``attnkit data get``: files fetched from a local HTTP server (127.0.0.1) are checked against their
SHA-256, a broken download resumes with a Range request, a wrong checksum or a refusal is a one-line error
naming the file, and the real data sets' checksums match the real files."""

import hashlib
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnkit.cli import app
from attnkit.data.download import DATASETS, DataFile, fetch
from attnkit.errors import DataError
from tests.cli.checks import one_line_error

SHARED = Path(os.environ.get("ATTNKIT_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


class Server:
    """Serves ``files`` (URL path -> bytes) with Range support; ``cut[path] = n`` sends only n bytes of
    the body (announcing all of them) and hangs up; ``ranges`` records each request's Range header."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.cut: dict[str, int] = {}
        self.ranges: list[str | None] = []
        self.honour_ranges = True
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = server.files.get(self.path)
                server.ranges.append(self.headers.get("Range"))
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                start, status = 0, 200
                if self.headers.get("Range") and server.honour_ranges:
                    start, status = int(self.headers["Range"].removeprefix("bytes=").rstrip("-")), 206
                    if start >= len(body):
                        self.send_error(416, "Range Not Satisfiable")
                        return
                self.send_response(status)
                self.send_header("Content-Length", str(len(body) - start))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.end_headers()
                self.wfile.write(body[start : start + server.cut.get(self.path, len(body))])
                self.close_connection = True

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server():
    serving = Server()
    yield serving
    serving.httpd.shutdown()
    serving.httpd.server_close()


def _file(server, name="a.bin", size=300_000):
    body = os.urandom(size)
    server.files[f"/{name}"] = body
    return DataFile(name, f"{server.url}/{name}", hashlib.sha256(body).hexdigest()), body


def test_a_file_is_fetched_checked_and_not_fetched_again(server, tmp_path):
    file, body = _file(server)
    assert fetch(file, tmp_path, progress=False).read_bytes() == body
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]  # no .part left behind
    fetch(file, tmp_path, progress=False)
    assert len(server.ranges) == 1  # already there and right: no second request


def test_a_broken_download_resumes_where_it_stopped(server, tmp_path):
    file, body = _file(server)
    server.cut["/a.bin"] = 100_000
    with pytest.raises(
        DataError, match=r"a\.bin: the download broke off after 100,000 .*run the same command"
    ):
        fetch(file, tmp_path, progress=False)
    assert (tmp_path / "a.bin.part").stat().st_size == 100_000 and not (tmp_path / "a.bin").exists()
    del server.cut["/a.bin"]
    assert fetch(file, tmp_path, progress=False).read_bytes() == body
    assert server.ranges == [None, "bytes=100000-"]


def test_a_server_that_cannot_be_reached_is_named_not_called_a_broken_download(tmp_path):
    with socket.socket() as free:  # a port nothing listens on once this closes
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    file = DataFile("a.bin", f"http://127.0.0.1:{port}/a.bin", "0" * 64)
    with pytest.raises(
        DataError, match=rf"^a\.bin: cannot download http://127\.0\.0\.1:{port}/a\.bin \(.*refused"
    ):
        fetch(file, tmp_path, progress=False)


def test_a_partial_file_planted_as_a_symbolic_link_is_refused_and_its_target_left_as_it_is(server, tmp_path):
    """A shared data folder: someone links a.bin.part to a file of yours; the download used to write
    into it."""
    file, _ = _file(server)
    target = tmp_path / "precious.txt"
    target.write_text("mine\n", encoding="utf-8")
    (tmp_path / "a.bin.part").symlink_to(target)
    with pytest.raises(DataError, match=r"a\.bin\.part: a symbolic link; attnkit never writes through one"):
        fetch(file, tmp_path, progress=False)
    assert target.read_text(encoding="utf-8") == "mine\n" and server.ranges == []


def test_a_server_that_ignores_the_range_gives_the_whole_file_again(server, tmp_path):
    file, body = _file(server)
    (tmp_path / "a.bin.part").write_bytes(body[:5000])
    server.honour_ranges = False
    assert fetch(file, tmp_path, progress=False).read_bytes() == body


def test_a_wrong_checksum_is_an_error_and_deletes_the_partial_file(server, tmp_path):
    file, _ = _file(server)
    wrong = DataFile(file.name, file.url, "0" * 64)
    with pytest.raises(DataError, match=r"^a\.bin: SHA-256 [0-9a-f]{64} is not the expected 0{64}"):
        fetch(wrong, tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_refusal_names_the_file_and_the_answer(server, tmp_path):
    with pytest.raises(DataError, match=r"^gone\.txt: http://127\.0\.0\.1:\d+/gone\.txt answered 404"):
        fetch(DataFile("gone.txt", f"{server.url}/gone.txt", "0" * 64), tmp_path, progress=False)


@pytest.mark.skipif(not (SHARED / "multi30k").is_dir(), reason=f"no Multi30k copy at {SHARED}/multi30k")
def test_data_get_lays_out_multi30k_from_a_mirror_with_the_real_checksums(server, tmp_path):
    """The real files, served from a local mirror: every checksum in the table matches them."""
    for file in DATASETS["multi30k"]:
        server.files[f"/multi30k/{file.name}"] = (SHARED / "multi30k" / file.name).read_bytes()
    result = CliRunner().invoke(app, ["data", "get", "multi30k", str(tmp_path / "m"), "--mirror", server.url])
    assert result.exit_code == 0, result.output
    for file in DATASETS["multi30k"]:
        assert (tmp_path / "m" / file.name).read_bytes() == server.files[f"/multi30k/{file.name}"]
    assert "ready: attnkit train configs/multi30k_de_en.yaml --data" in result.stdout


@pytest.mark.parametrize("name", ["sst2", "tinyshakespeare"])
def test_the_other_checksums_match_the_real_files(name):
    folder = SHARED / name
    if not folder.is_dir():
        pytest.skip(f"no {name} copy at {folder}")
    for file in DATASETS[name]:
        assert hashlib.sha256((folder / file.name).read_bytes()).hexdigest() == file.digest, file.name


def test_an_unknown_data_set_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(app, ["data", "get", "imagenet", str(tmp_path)])
    assert result.exit_code == 2
    assert (
        "unknown data set 'imagenet'; choose one of multi30k, sst2, tinyshakespeare, iwslt14" in result.output
    )


def test_a_folder_that_cannot_be_made_is_a_one_line_error_before_any_download(tmp_path):
    (tmp_path / "data").write_text("the user's", encoding="utf-8")  # a file where the folder should go
    result = CliRunner().invoke(app, ["data", "get", "multi30k", str(tmp_path / "data")])
    one_line_error(result, r"data: cannot make the folder \(File exists\)")
    assert (tmp_path / "data").read_text(encoding="utf-8") == "the user's"


def _get_and_compare(server, name: str, folder: Path, want: dict[str, list[str]]):
    """``attnkit data get NAME FOLDER`` from the local mirror; each file made holds the lines wanted."""
    result = CliRunner().invoke(app, ["data", "get", name, str(folder), "--mirror", server.url])
    assert result.exit_code == 0, result.output
    for file, lines in want.items():
        assert (folder / file).read_text(encoding="utf-8").splitlines() == lines, file
    return result


def _iwslt14_archive(path: Path) -> dict[str, list[str]]:
    """A small archive laid out as fairseq's IWSLT14 de-en.tgz (a de-en/ folder with the training
    transcripts and the evaluation sets' XML); returns what fairseq's prepare-iwslt14.sh, without its
    tokeniser and lower-casing, makes of it."""
    import io
    import tarfile

    de, en, kept = [], [], []
    for i in range(1, 51):  # tag lines, kept sentences, and pairs the cleaning step drops
        if i % 10 == 1:
            de += [
                f"<url>http://www.ted.com/talks/{i}</url>",
                "<keywords>talks</keywords>",
                f"<talkid>{i}</talkid>",
            ]
            en += [
                f"<url>http://www.ted.com/talks/{i}</url>",
                "<keywords>talks</keywords>",
                f"<talkid>{i}</talkid>",
            ]
            de.append(f"<title>Titel {i}</title>"), en.append(f"<title>Title {i}</title>")
            kept.append((f"Titel {i}", f"Title {i}"))
        if i % 7 == 0:  # one side more than 1.5 times as long as the other
            de.append("eins zwei drei vier"), en.append("one two")
        de.append(f"Das ist Satz Nummer {i} ."), en.append(f"This is sentence {i} .")
        kept.append((f"Das ist Satz Nummer {i} .", f"This is sentence {i} ."))
    files = {"de-en/train.tags.de-en.de": de, "de-en/train.tags.de-en.en": en}
    test = {"de": [], "en": []}
    sets = ["IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
            "IWSLT14.TED.tst2012"]  # fmt: skip
    for n, name in enumerate(sets):
        for lang, words in (("de", "Prüfung"), ("en", "It\u2019s test")):
            lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>", '<doc docid="1">']
            for seg in range(1, 3):
                lines.append(f'<seg id="{seg}"> {words} {n}.{seg} </seg>')
                test[lang].append(f"{words.replace(chr(0x2019), chr(39))} {n}.{seg}")
            files[f"de-en/{name}.de-en.{lang}.xml"] = [*lines, "</doc>", "</mteval>"]
    with tarfile.open(path, "w:gz") as tar:
        for name, lines in files.items():
            body = "".join(line + "\n" for line in lines).encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    valid = [pair for i, pair in enumerate(kept, 1) if i % 23 == 0]
    train = [pair for i, pair in enumerate(kept, 1) if i % 23 != 0]
    return {
        "train.de": [d for d, _ in train], "train.en": [e for _, e in train],
        "valid.de": [d for d, _ in valid], "valid.en": [e for _, e in valid],
        "test.de": test["de"], "test.en": test["en"],
    }  # fmt: skip


def test_data_get_iwslt14_checks_the_archive_and_splits_it_as_fairseq_does(server, tmp_path, monkeypatch):
    archive = tmp_path / "de-en.tgz"
    want = _iwslt14_archive(archive)
    body = archive.read_bytes()
    server.files["/iwslt14/de-en.tgz"] = body
    monkeypatch.setitem(
        DATASETS, "iwslt14", [DataFile("de-en.tgz", "unused", hashlib.md5(body).hexdigest(), "md5")]
    )
    folder = tmp_path / "iwslt14"
    result = _get_and_compare(server, "iwslt14", folder, want)
    assert "de-en.tgz: " in result.stdout and "MD5 checked" in result.stdout
    assert len(want["valid.de"]) == 2 and len(want["test.de"]) == 10  # the fixture exercises the split
    assert "ready: attnkit train configs/iwslt14_de_en.yaml --data" in result.stdout
    recipe = str(Path(__file__).resolve().parents[2] / "configs" / "iwslt14_de_en.yaml")
    arguments = [
        "train",
        recipe,
        "--data",
        str(folder),
        "--run-dir",
        str(tmp_path / "run"),
        "train.max_steps=1",
    ]
    trained = CliRunner().invoke(app, [*arguments, "train.eval_every=1"])  # the recipe reads the files made
    assert trained.exit_code == 0, trained.output
    assert f"training pairs: {len(want['train.de'])}; validation: 2;" in trained.output


def test_an_iwslt14_archive_with_a_wrong_md5_or_a_missing_set_is_a_one_line_error(
    server, tmp_path, monkeypatch
):
    import tarfile

    archive = tmp_path / "de-en.tgz"
    _iwslt14_archive(archive)
    server.files["/iwslt14/de-en.tgz"] = archive.read_bytes()
    monkeypatch.setitem(DATASETS, "iwslt14", [DataFile("de-en.tgz", "unused", "0" * 32, "md5")])
    result = CliRunner().invoke(app, ["data", "get", "iwslt14", str(tmp_path / "a"), "--mirror", server.url])
    assert result.exit_code != 0
    assert "de-en.tgz: MD5 " in result.output and "is not the expected " + "0" * 32 in result.output

    with tarfile.open(archive) as full, tarfile.open(tmp_path / "short.tgz", "w:gz") as short:
        for member in full.getmembers():
            if "tst2012" not in member.name:
                short.addfile(member, full.extractfile(member))
    body = (tmp_path / "short.tgz").read_bytes()
    server.files["/iwslt14/de-en.tgz"] = body
    monkeypatch.setitem(
        DATASETS, "iwslt14", [DataFile("de-en.tgz", "unused", hashlib.md5(body).hexdigest(), "md5")]
    )
    result = CliRunner().invoke(app, ["data", "get", "iwslt14", str(tmp_path / "b"), "--mirror", server.url])
    assert result.exit_code != 0
    assert "the archive has no IWSLT14.TED.tst2012.de-en.de.xml" in result.output
    assert not (tmp_path / "b" / "train.de").exists()


def test_a_file_of_the_same_name_that_is_not_the_data_sets_is_never_replaced(server, tmp_path):
    """The user's own ``a.bin`` (or another version of it) in the folder: refused in one line, kept."""
    file, _ = _file(server)
    (tmp_path / "a.bin").write_bytes(b"the user's own")
    with pytest.raises(DataError, match=r"a\.bin: already there, and not the file the data set has"):
        fetch(file, tmp_path, progress=False)
    assert (tmp_path / "a.bin").read_bytes() == b"the user's own" and server.ranges == []


def test_iwslt14_never_replaces_a_file_it_did_not_make(server, tmp_path, monkeypatch):
    archive = tmp_path / "de-en.tgz"
    _iwslt14_archive(archive)
    body = archive.read_bytes()
    server.files["/iwslt14/de-en.tgz"] = body
    monkeypatch.setitem(
        DATASETS, "iwslt14", [DataFile("de-en.tgz", "unused", hashlib.md5(body).hexdigest(), "md5")]
    )
    folder = tmp_path / "iwslt14"
    command = ["data", "get", "iwslt14", str(folder), "--mirror", server.url]
    assert CliRunner().invoke(app, command).exit_code == 0
    assert CliRunner().invoke(app, command).exit_code == 0  # made again, the same: fine
    (folder / "valid.en").write_text("my own validation set\n", encoding="utf-8")
    before = (folder / "train.de").stat().st_mtime_ns
    result = CliRunner().invoke(app, command)
    one_line_error(result, r"valid\.en: already there, and not what attnkit makes of de-en\.tgz")
    assert (folder / "valid.en").read_text(encoding="utf-8") == "my own validation set\n"
    assert (folder / "train.de").stat().st_mtime_ns == before  # nothing written


def _tgz(path: Path, files: dict[str, str]) -> bytes:
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            body = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return path.read_bytes()


def _sgm(lines: list[str]) -> str:
    segs = "".join(f'<seg id="{i}">{line}</seg>\n' for i, line in enumerate(lines, 1))
    return f'<srcset setid="newstest" srclang="any">\n<doc docid="1" genre="news">\n{segs}</doc>\n</srcset>\n'


def _wmt14_archives(tmp_path: Path, europarl_en: list[str] | None = None) -> tuple[dict, dict]:
    """Small archives laid out as WMT's (each corpus's German-English files among other languages' and
    sets'); returns {name: bytes} and what attnkit makes of them."""
    corpora = {
        "europarl": ([f"Sitzung {i} ." for i in range(5)], [f"Session {i} ." for i in range(5)]),
        "commoncrawl": (["Hallo Welt", "Ein Ü-Ei"], ["Hello world", "A surprise egg"]),
        "nc": (["Die Börse fiel ."], ["The stock market fell ."]),
    }
    de, en = corpora["europarl"]
    en = europarl_en if europarl_en is not None else en
    archives = {
        "de-en.tgz": {"europarl-v7.de-en.de": "\n".join(de) + "\n", "europarl-v7.de-en.en": "\n".join(en)},
        "training-parallel-commoncrawl.tgz": {
            "commoncrawl.fr-en.fr": "Bonjour\n",
            "commoncrawl.de-en.de": "\n".join(corpora["commoncrawl"][0]) + "\n",
            "commoncrawl.de-en.en": "\n".join(corpora["commoncrawl"][1]) + "\n",
        },
        "training-parallel-nc-v9.tgz": {
            "training/news-commentary-v9.de-en.de": corpora["nc"][0][0] + "\n",
            "training/news-commentary-v9.de-en.en": corpora["nc"][1][0] + "\n",
            "training/news-commentary-v9.cs-en.cs": "Ahoj\n",
        },
        "test.tgz": {
            "test/newstest2012-src.de.sgm": _sgm(["alt"]),
            "test/newstest2013-src.en.sgm": _sgm(["A dog runs .", "It's late & dark ."]),
            "test/newstest2013-src.de.sgm": _sgm(["Ein Hund läuft .", "Es ist spät & dunkel ."]),
        },
        "test-full.tgz": {
            "test-full/newstest2014-deen-src.de.sgm": _sgm(["Guten Morgen ."]),
            "test-full/newstest2014-deen-ref.en.sgm": _sgm(["Good morning ."]),
            "test-full/newstest2014-deen-src.en.sgm": _sgm(["Good night ."]),
            "test-full/newstest2014-deen-ref.de.sgm": _sgm(["Gute Nacht ."]),
        },
    }
    bodies = {name: _tgz(tmp_path / name, files) for name, files in archives.items()}
    want = {
        "train.de": de + corpora["commoncrawl"][0] + corpora["nc"][0],
        "train.en": en + corpora["commoncrawl"][1] + corpora["nc"][1],
        "valid.en": ["A dog runs .", "It's late & dark ."],
        "valid.de": ["Ein Hund läuft .", "Es ist spät & dunkel ."],
        "test.en": ["Good night ."], "test.de": ["Gute Nacht ."],
    }  # fmt: skip
    return bodies, want


def _serve_wmt14(server, monkeypatch, bodies: dict) -> None:
    files = []
    for file in DATASETS["wmt14-en-de"]:
        body = bodies[file.name]
        server.files[f"/wmt14-en-de/{file.name}"] = body
        files.append(
            DataFile(file.name, "unused", hashlib.new(file.algorithm, body).hexdigest(), file.algorithm)
        )
    monkeypatch.setitem(DATASETS, "wmt14-en-de", files)


def test_data_get_wmt14_joins_the_three_corpora_and_takes_newstest2013_and_2014(
    server, tmp_path, monkeypatch
):
    bodies, want = _wmt14_archives(tmp_path)
    _serve_wmt14(server, monkeypatch, bodies)
    folder = tmp_path / "wmt14"
    result = _get_and_compare(server, "wmt14-en-de", folder, want)
    assert "SHA-1 checked" in result.stdout and "MD5 checked" in result.stdout
    assert not list(folder.glob("*.part"))
    assert "ready: attnkit train configs/wmt14_en_de_base.yaml --data" in result.stdout
    again = CliRunner().invoke(app, ["data", "get", "wmt14-en-de", str(folder), "--mirror", server.url])
    assert again.exit_code == 0, again.output  # made again, the same: fine
    recipe = str(Path(__file__).resolve().parents[2] / "configs" / "wmt14_en_de_base.yaml")
    small = ["model.preset=tiny", "data.vocab_size=300", "train.max_tokens=400", "train.update_freq=1",
             "train.max_steps=1", "train.eval_every=1", "train.warmup=1", "decode.beam_size=1"]  # fmt: skip
    trained = CliRunner().invoke(
        app, ["train", recipe, "--data", str(folder), "--run-dir", str(tmp_path / "run"), *small]
    )  # the recipe reads the files made
    assert trained.exit_code == 0, trained.output
    assert "training pairs: 8; validation: 2;" in trained.output


def test_a_wmt14_corpus_with_uneven_sides_is_a_one_line_error_and_nothing_is_kept(
    server, tmp_path, monkeypatch
):
    bodies, _ = _wmt14_archives(tmp_path, europarl_en=["Session 0 ."])
    _serve_wmt14(server, monkeypatch, bodies)
    folder = tmp_path / "wmt14"
    result = CliRunner().invoke(app, ["data", "get", "wmt14-en-de", str(folder), "--mirror", server.url])
    one_line_error(result, r"de-en\.tgz: europarl-v7\.de-en has 1 English and 5 German lines")
    assert not (folder / "train.de").exists() and not list(folder.glob("*.part"))
