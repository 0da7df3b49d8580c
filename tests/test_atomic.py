"""Files and folders written atomically get the permissions the user's umask gives any new file, and
finding the umask never changes it (a server's other threads create files meanwhile: setting it to 0
to read it, even for a moment, would make theirs world-writable)."""

import os
import stat
import threading

import pytest

from attnkit import atomic
from attnkit.atomic import open_own
from attnkit.errors import AttnkitError


@pytest.fixture
def umask_027():
    before = os.umask(0o027)
    yield
    os.umask(before)


def test_written_files_and_folders_follow_the_umask(tmp_path, umask_027):
    atomic.write_text_atomic(tmp_path / "out.txt", "text")
    assert stat.S_IMODE((tmp_path / "out.txt").stat().st_mode) == 0o640
    folder = tmp_path / "folder"
    folder.mkdir(mode=0o700)
    atomic.make_shareable(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o750


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the umask from /proc (Linux)")
def test_reading_the_umask_never_changes_it(tmp_path, monkeypatch, umask_027):
    """While attnkit reads the umask, a file made by another thread still gets it: os.umask is never
    called (it used to set the umask to 0 and back, on every file written)."""
    calls = []
    monkeypatch.setattr(os, "umask", lambda mask: calls.append(mask) or 0o027)
    made = []

    def other_thread():
        for i in range(200):
            path = tmp_path / f"other-{i}"
            path.touch(mode=0o666)
            made.append(stat.S_IMODE(path.stat().st_mode))

    thread = threading.Thread(target=other_thread)
    thread.start()
    for i in range(200):
        atomic.write_text_atomic(tmp_path / f"ours-{i}", "x")
    thread.join()
    assert calls == []
    assert set(made) == {0o640}


@pytest.mark.parametrize("mode", ["wb", "ab", "r+"])
def test_open_own_never_opens_through_a_symbolic_link(tmp_path, mode):
    target = tmp_path / "precious.txt"
    target.write_text("mine\n", encoding="utf-8")
    (tmp_path / "own").symlink_to(target)
    with pytest.raises(AttnkitError, match=r"own: a symbolic link; attnkit never writes through one"):
        open_own(tmp_path / "own", mode)
    assert target.read_text(encoding="utf-8") == "mine\n"
    with open_own(tmp_path / "fresh", mode) as made:  # a plain file is made as open() makes it
        made.write(b"x" if "b" in mode else "x")
    assert (tmp_path / "fresh").read_text(encoding="utf-8") == "x"


def test_a_file_written_by_name_replaces_its_path_whole_or_not_at_all(tmp_path):
    """``atomic_path``: what the writer wrote becomes the file; a writer that fails leaves the old file
    and no temporary one."""
    path = tmp_path / "weights.bin"
    path.write_bytes(b"old")
    with pytest.raises(OSError), atomic.atomic_path(path) as temporary:
        temporary.write_bytes(b"half")
        raise OSError("disk full")
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["weights.bin"]
    with atomic.atomic_path(path) as temporary:
        temporary.write_bytes(b"new")
    assert path.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["weights.bin"]
