"""The prepared token store (data/store.py): built once from parallel files, found again by later runs
without reading the training text, rebuilt when an input or a setting changes or when its files no
longer match what was written, and giving the same training data as encoding the files directly."""

import os

import numpy as np
import pytest

import attnkit.tasks.translation as translation
from attnkit.config import load_run_config
from attnkit.data.readers import iter_pairs, read_parallel
from attnkit.data.store import StoreColumn, open_store, store_root, write_store
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import DataError


def _data_config(copy_data, tmp_path, *extra):
    return load_run_config(None, [
        "data.task=parallel", f"data.dir={copy_data}", "data.train=[train.src, train.tgt]",
        "data.valid=[valid.src, valid.tgt]", "data.tokenizer=char", "data.max_len=6",
        f"data.store={tmp_path / 'stores'}", *extra,
    ]).data  # fmt: skip


def _reads_of_training_text(monkeypatch) -> list:
    """Records each pass over the training files (a build reads them twice: the tokenizer's sample,
    then the encoding; the validation files are read every run)."""
    reads = []
    real = translation.iter_pairs

    def counting(src, tgt, skipped):
        reads.append(src.name)
        return real(src, tgt, skipped)

    monkeypatch.setattr(translation, "iter_pairs", counting)
    return reads


def test_a_store_gives_the_pairs_encoding_the_files_gives(copy_data, tmp_path):
    config = _data_config(copy_data, tmp_path)
    messages = []
    data = translation.prepare_data(config, 0, echo=messages.append)
    assert isinstance(data.train_src, StoreColumn) and any("built now" in m for m in messages)
    pairs = read_parallel(copy_data / "train.src", copy_data / "train.tgt")
    tokenizer = Tokenizer.train("char", pairs.src + pairs.tgt, config.vocab_size)
    src, tgt = tokenizer.encode_batch(pairs.src), tokenizer.encode_batch(pairs.tgt)
    kept = [i for i in range(len(src)) if len(src[i]) + 1 <= 6 and len(tgt[i]) + 1 <= 6]  # data.max_len
    assert 0 < len(kept) < len(src)  # the setting drops some pairs: the store keeps the same ones
    assert data.tokenizer.to_str() == tokenizer.to_str()
    assert [data.train_src[i] for i in range(len(data.train_src))] == [src[i] for i in kept]
    assert [data.train_tgt[i] for i in range(len(data.train_tgt))] == [tgt[i] for i in kept]
    src_lengths, tgt_lengths = data.train_lengths()
    assert src_lengths.tolist() == [len(src[i]) + 1 for i in kept]
    assert tgt_lengths.tolist() == [len(tgt[i]) + 1 for i in kept]
    assert any(f"dropped {len(src) - len(kept)} training pairs longer" in m for m in messages)


def test_a_later_run_finds_the_store_without_reading_the_training_text(copy_data, tmp_path, monkeypatch):
    config = _data_config(copy_data, tmp_path)
    reads = _reads_of_training_text(monkeypatch)
    first_messages, second_messages = [], []
    first = translation.prepare_data(config, 0, echo=first_messages.append)
    second = translation.prepare_data(config, 0, echo=second_messages.append)
    assert reads == ["train.src", "train.src"]  # built once (sample, encode); found the second time
    assert any("built before" in m for m in second_messages)
    assert [m for m in first_messages if "token store" not in m] == [
        m for m in second_messages if "token store" not in m
    ]  # the same report either way (pairs dropped, counts)
    assert second.tokenizer.to_str() == first.tokenizer.to_str()
    assert list(second.train_src) == list(first.train_src)
    # a resumed run hands its own tokenizer: the same one finds the same store
    translation.prepare_data(config, 0, first.tokenizer, echo=lambda m: None)
    assert len(reads) == 2


def test_a_changed_setting_or_input_builds_another_store(copy_data, tmp_path, monkeypatch):
    reads = _reads_of_training_text(monkeypatch)
    translation.prepare_data(_data_config(copy_data, tmp_path), 0, echo=lambda m: None)
    translation.prepare_data(_data_config(copy_data, tmp_path, "data.max_len=8"), 0, echo=lambda m: None)
    assert len(reads) == 4 and len(list((tmp_path / "stores").iterdir())) == 2
    changed = tmp_path / "changed"
    changed.mkdir()
    for name in ("train.src", "train.tgt", "valid.src", "valid.tgt"):
        (changed / name).write_bytes((copy_data / name).read_bytes())
    with (
        (changed / "train.src").open("a", encoding="utf-8") as f,
        (changed / "train.tgt").open("a", encoding="utf-8") as g,
    ):
        f.write("1 2\n"), g.write("1 2\n")
    data = translation.prepare_data(_data_config(changed, tmp_path), 0, echo=lambda m: None)
    assert len(reads) == 6 and data.train_src[len(data.train_src) - 1] == data.tokenizer.encode("1 2")


@pytest.mark.parametrize(
    "damage", ["truncate ids", "lose tokenizer", "change offsets", "garble meta", "overwrite ids in place"]
)
def test_a_damaged_store_is_built_again_with_a_note(copy_data, tmp_path, monkeypatch, damage):
    config = _data_config(copy_data, tmp_path)
    reads = _reads_of_training_text(monkeypatch)
    first = translation.prepare_data(config, 0, echo=lambda m: None)
    pairs = list(first.train_src), list(first.train_tgt)  # read now: the damage below is to these files
    folder = next((tmp_path / "stores").iterdir())
    if damage == "truncate ids":
        with (folder / "src.ids").open("r+b") as f:
            f.truncate(os.path.getsize(folder / "src.ids") - 2)
    elif damage == "lose tokenizer":
        (folder / "tokenizer.json").unlink()
    elif damage == "overwrite ids in place":  # the same size: zero pages after a crash, say
        size = os.path.getsize(folder / "src.ids")
        with (folder / "src.ids").open("r+b") as f:
            f.write(bytes(size))
    elif damage == "change offsets":
        offsets = np.load(folder / "tgt.offsets.npy")
        offsets[3] += 1
        np.save(folder / "tgt.offsets.npy", offsets)
    else:
        (folder / "meta.json").write_text("{", encoding="utf-8")
    messages = []
    again = translation.prepare_data(config, 0, echo=messages.append)
    assert len(reads) == 4
    assert any("building it again" in m and str(folder) in m for m in messages), messages
    assert (list(again.train_src), list(again.train_tgt)) == pairs
    open_store(folder)  # whole again


def test_a_missing_training_file_is_a_one_line_error(copy_data, tmp_path):
    config = _data_config(copy_data, tmp_path, "data.train=[nothing.src, train.tgt]")
    with pytest.raises(DataError, match=r"nothing\.src: file not found"):
        translation.prepare_data(config, 0, echo=lambda m: None)


def test_two_writers_of_one_store_leave_one_whole_store(tmp_path):
    """The second writer of a key finds the first's store in place and returns it; no temporary
    folder is left behind."""
    tokenizer = Tokenizer.train("char", ["abc", "cab"], 100)
    rows = [[4, 5], [6], []]
    first = write_store(tmp_path / "key", tokenizer, ["src"], [(row,) for row in rows])
    second = write_store(tmp_path / "key", tokenizer, ["src"], [([7, 7, 7],)])
    assert list(first.columns["src"]) == list(second.columns["src"]) == rows
    assert first.columns["src"][-1] == [] and first.columns["src"][-3] == [4, 5]
    with pytest.raises(IndexError):
        first.columns["src"][3]
    assert [p.name for p in tmp_path.iterdir()] == ["key"]
    assert first.columns["src"].ids.dtype == np.uint16  # a small vocabulary: two bytes a token


def test_the_default_store_root_is_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert store_root("") == tmp_path / "attnkit" / "stores"
    assert store_root("~/stores").name == "stores"


def test_attnkit_prepare_builds_the_store_a_run_then_finds(copy_data, tmp_path):
    from typer.testing import CliRunner

    from attnkit.cli import app
    from tests.cli.checks import one_line_error

    runner = CliRunner()
    args = ["prepare", "--data", str(copy_data), "data.train=[train.src, train.tgt]",
            "data.valid=[valid.src, valid.tgt]", "data.tokenizer=char", f"data.store={tmp_path}"]  # fmt: skip
    first, second = runner.invoke(app, args), runner.invoke(app, args)
    assert first.exit_code == 0 and "built now" in first.output, first.output
    assert second.exit_code == 0 and "built before" in second.output, second.output
    messages = []
    config = _data_config(copy_data, tmp_path, f"data.store={tmp_path}", "data.max_len=128")
    translation.prepare_data(config, 0, echo=messages.append)
    assert any("built before" in m for m in messages)  # what a run with the same settings finds
    one_line_error(
        runner.invoke(app, ["prepare", "data.task=dates"]), r"attnkit prepare encodes parallel files"
    )


def test_the_tokenizer_learns_from_a_bounded_sample_in_file_order(tmp_path):
    files = [tmp_path / "train.src", tmp_path / "train.tgt"]
    files[0].write_text("".join(f"s{i}\n" for i in range(100)), encoding="utf-8")
    files[1].write_text("".join(f"t{i}\n" for i in range(100)), encoding="utf-8")
    everything = [f"s{i}" for i in range(100)] + [f"t{i}" for i in range(100)]

    def pairs():
        return iter_pairs(*files, {})

    assert translation._sample(pairs(), 1_000) == everything  # a smaller corpus: all of it, in order
    sample = translation._sample(pairs(), 7)
    index = [int(s[1:]) for s in sample[:7]]
    assert sample[7:] == [f"t{i}" for i in index] and index == sorted(index) and len(set(index)) == 7
    assert index != list(range(7))  # drawn from the whole file, not its beginning
    assert translation._sample(pairs(), 7) == sample  # the same sample every time


def test_streamed_pairs_give_read_parallels_errors(tmp_path):
    from attnkit.data.readers import iter_pairs

    (tmp_path / "a").write_text("x\ny\n\nz\n", encoding="utf-8")
    (tmp_path / "b").write_text("1\n2\n3\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"a has 4 lines but .*b has 3: parallel files must align"):
        list(iter_pairs(tmp_path / "a", tmp_path / "b", {}))
    (tmp_path / "c").write_text("1\n2\n3\n4\n", encoding="utf-8")
    skipped = {}
    assert list(iter_pairs(tmp_path / "a", tmp_path / "c", skipped)) == [("x", "1"), ("y", "2"), ("z", "4")]
    assert skipped == {"dropped_empty": 1}
    (tmp_path / "blank").write_text("\n \n\n\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"blank: file is empty"):
        list(iter_pairs(tmp_path / "blank", tmp_path / "c", {}))


def test_summaries_are_prepared_once_into_a_store_with_their_sources_cut(tmp_path):
    import json

    records = [{"email": " ".join(f"w{i}{j}" for j in range(3 + i % 9)), "subject": f"s{i} re"}
               for i in range(40)]  # fmt: skip
    for name, rows in (("train.jsonl", records), ("dev.jsonl", records[:5])):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = load_run_config(None, [
        "data.task=summarise", f"data.dir={tmp_path}", "data.train=[train.jsonl]", "data.valid=[dev.jsonl]",
        "data.fields=[email, subject]", "data.tokenizer=word", "data.max_source_len=5",
        f"data.store={tmp_path / 'stores'}",
    ]).data  # fmt: skip
    first_messages, second_messages = [], []
    first = translation.prepare_data(config, 0, echo=first_messages.append)
    second = translation.prepare_data(config, 0, echo=second_messages.append)
    assert isinstance(first.train_src, StoreColumn)
    assert any("built now" in m for m in first_messages) and any("built before" in m for m in second_messages)
    tokenizer = Tokenizer.train("word", [r["email"] for r in records] + [r["subject"] for r in records], 8000)
    sources = [ids[:4] for ids in tokenizer.encode_batch([r["email"] for r in records])]  # 5 with </s>
    assert first.tokenizer.to_str() == tokenizer.to_str()
    assert list(second.train_src) == sources
    assert list(second.train_tgt) == tokenizer.encode_batch([r["subject"] for r in records])
    cut = sum(3 + i % 9 > 4 for i in range(40))
    said = f"cut {cut:,} of 40 training sources to data.max_source_len=5 tokens"
    assert said in first_messages and said in second_messages  # the store remembers what its build cut


def test_a_build_with_a_given_tokenizer_reads_the_training_text_once(copy_data, tmp_path, monkeypatch):
    """A resumed run whose store is gone encodes with its own tokenizer: no sample to learn one from."""
    tokenizer = translation.prepare_data(
        _data_config(copy_data, tmp_path / "first"), 0, echo=lambda m: None
    ).tokenizer
    reads = _reads_of_training_text(monkeypatch)
    translation.prepare_data(_data_config(copy_data, tmp_path / "second"), 0, tokenizer, echo=lambda m: None)
    assert reads == ["train.src"]  # the encoding pass alone


@pytest.mark.parametrize("blocker", ["a file", "read-only"])
def test_a_store_root_that_cannot_be_written_is_one_line_naming_data_store(copy_data, tmp_path, blocker):
    root = tmp_path / "stores"
    if blocker == "a file":
        root.write_text("", encoding="utf-8")
    else:
        root.mkdir()
        root.chmod(0o555)
        if os.access(root, os.W_OK):  # root ignores permissions
            pytest.skip("this user writes into read-only folders (root)")
    config = _data_config(copy_data, tmp_path, f"data.store={root}")
    with pytest.raises(DataError, match=rf"^data\.store {root}: cannot write token stores there \(.+\); set"):
        translation.prepare_data(config, 0, echo=lambda m: None)


def test_a_store_is_published_with_the_permissions_of_any_new_folder(tmp_path):
    """Others sharing data.store read what one user built (mkdtemp's folders are private, 0700)."""
    tokenizer = Tokenizer.train("char", ["abc"], 100)
    old = os.umask(0o022)
    try:
        write_store(tmp_path / "key", tokenizer, ["src"], [([4, 5],)])
    finally:
        os.umask(old)
    assert (tmp_path / "key").stat().st_mode & 0o777 == 0o755
    assert {path.stat().st_mode & 0o777 for path in (tmp_path / "key").iterdir()} == {0o644}


def test_a_build_stopped_by_sigterm_leaves_no_temporary_folder(tmp_path):
    """Slurm's time limit sends SIGTERM: the build's temporary folder goes with it."""
    import signal
    import subprocess
    import sys
    import textwrap

    builder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import pathlib, time
        from attnkit.data.store import write_store
        from attnkit.data.tokenizer import Tokenizer

        def rows():
            yield ([4, 5],)
            print("building", flush=True)
            time.sleep(60)
            yield ([6],)

        tokenizer = Tokenizer.train("char", ["abc"], 100)
        write_store(pathlib.Path({str(tmp_path / "key")!r}), tokenizer, ["src"], rows())
    """)], stdout=subprocess.PIPE, text=True, encoding="utf-8")  # fmt: skip
    assert builder.stdout.readline().strip() == "building"
    assert len(list(tmp_path.iterdir())) == 1  # its temporary folder
    builder.send_signal(signal.SIGTERM)
    assert builder.wait(timeout=30) == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []


def test_temporary_folders_of_builds_killed_outright_are_swept_by_the_next_build(copy_data, tmp_path):
    """SIGKILL leaves a build's folder: the next build on the machine removes it once its process is gone,
    and leaves those of live processes and of other machines."""
    import socket
    import subprocess
    import sys

    root = tmp_path / "stores"
    root.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, encoding="utf-8", check=True).stdout.strip()  # fmt: skip
    host = socket.gethostname()
    dead = root / f".0123abcd.{host}-{gone}.x1y2z3"
    alive = root / f".0123abcd.{host}-{os.getpid()}.a1b2c3"
    elsewhere = root / f".0123abcd.another.host-{gone}.q1w2e3"
    for folder in (dead, alive, elsewhere):
        folder.mkdir()
    translation.prepare_data(_data_config(copy_data, tmp_path, f"data.store={root}"), 0, echo=lambda m: None)
    assert not dead.exists() and alive.exists() and elsewhere.exists()
