"""Parallel text is read together, and bad input is one clear error naming the file and line."""

import gzip
import io
import json
import sys

import pytest

from attnkit.data.readers import iter_lines, read_jsonl, read_lines, read_parallel, read_text
from attnkit.errors import DataError


def test_plain_and_gzip_files_read_the_same(tmp_path):
    text = "eins\nzwei\r\ndrei\n"
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(text.encode()))
    assert read_lines(tmp_path / "a.txt") == read_lines(tmp_path / "a.txt.gz") == ["eins", "zwei", "drei"]


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path, monkeypatch):
    text = "eins\r\nzwei\r\n"  # as Notepad saves "UTF-8 with BOM"
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + text.encode())
    (tmp_path / "bom.txt.gz").write_bytes(gzip.compress(b"\xef\xbb\xbf" + text.encode()))
    assert read_lines(tmp_path / "bom.txt") == read_lines(tmp_path / "bom.txt.gz") == ["eins", "zwei"]
    assert read_text(tmp_path / "bom.txt") == text
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbf" + text.encode())))
    assert list(iter_lines(None)) == ["eins", "zwei"]  # what translate reads without -i
    (tmp_path / "only_bom.txt").write_bytes(b"\xef\xbb\xbf\n")
    with pytest.raises(DataError, match=r"only_bom\.txt: file is empty"):
        read_text(tmp_path / "only_bom.txt")


def test_empty_pairs_are_dropped_together_so_alignment_survives(tmp_path):
    (tmp_path / "s").write_text("a\n\nc\nd\n", encoding="utf-8")
    (tmp_path / "t").write_text("A\nB\n \nD\n", encoding="utf-8")
    pairs = read_parallel(tmp_path / "s", tmp_path / "t")
    assert list(zip(pairs.src, pairs.tgt, strict=True)) == [("a", "A"), ("d", "D")]
    assert pairs.dropped_empty == 2


def test_line_count_mismatch_gives_both_counts(tmp_path):
    (tmp_path / "s").write_text("a\nb\nc\n", encoding="utf-8")
    (tmp_path / "t").write_text("A\nB\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"s has 3 lines but .*t has 2"):
        read_parallel(tmp_path / "s", tmp_path / "t")


def test_missing_and_empty_files_are_named(tmp_path):
    with pytest.raises(DataError, match=r"nope\.txt: file not found"):
        read_lines(tmp_path / "nope.txt")
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"empty\.txt: file is empty"):
        read_lines(tmp_path / "empty.txt")


def test_invalid_utf8_names_the_line(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"fine\nalso fine\nbroken \xff here\n")
    with pytest.raises(DataError, match=r"bad\.txt:3: invalid UTF-8"):
        read_lines(tmp_path / "bad.txt")


def test_json_lines_give_sources_and_one_or_several_references(tmp_path):
    path = tmp_path / "dev.jsonl.gz"
    records = [
        {"email": "Hi, the meeting moves to 3pm.\nThanks", "subject": "Meeting",
         "annotations": ["meeting at 3", "new time"]},
        {"email": "  Please send the file. ", "subject": "file", "annotations": ["send file"]},
    ]  # fmt: skip
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in records) + "\n\n")
    single = read_jsonl(path, "email", "subject")
    assert single.src == ["Hi, the meeting moves to 3pm.\nThanks", "Please send the file."]
    assert single.references == {"subject": [["Meeting"], ["file"]]}
    both = read_jsonl(path, "email", "subject", "annotations")  # several fields in one reading
    assert both.src == single.src and both.references == {
        "subject": [["Meeting"], ["file"]],
        "annotations": [["meeting at 3", "new time"], ["send file"]],
    }


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"bad\.jsonl:2: not JSON"),
        ("[1, 2]", r"bad\.jsonl:2: a line must be a JSON object, got list"),
        ('{"email": "x"}', r"bad\.jsonl:2: no field 'subject' \(fields: email\)"),
        (
            '{"email": "x", "subject": []}',
            r"bad\.jsonl:2: 'email' must be a string and 'subject' a string or a",
        ),
    ],
)
def test_bad_json_lines_name_the_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"email": "fine", "subject": "ok"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=message):
        read_jsonl(path, "email", "subject")


def test_json_lines_are_streamed_a_record_at_a_time(tmp_path):
    from attnkit.data.readers import iter_jsonl

    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"email": "a b", "subject": "a"}\n{"email": "c", "subject": "\xff"}\n')
    records = iter_jsonl(path, "email", "subject")
    assert next(records) == ("a b", {"subject": ["a"]})  # read before the second line is
    with pytest.raises(DataError, match=r"records\.jsonl:2: invalid UTF-8"):
        next(records)
    (tmp_path / "blank.jsonl").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(DataError, match=r"blank\.jsonl: file is empty"):
        list(iter_jsonl(tmp_path / "blank.jsonl", "email", "subject"))
