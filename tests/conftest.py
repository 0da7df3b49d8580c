"""Test-wide settings: hypothesis runs without per-example deadlines (CI machines are shared and slow)
and, under CI, with a fixed seed so that a run is reproducible."""

import os

import pytest
import torch
from hypothesis import settings

from attnkit.data.synthetic import copy

settings.register_profile("default", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture(scope="session", autouse=True)
def own_cache_folder(tmp_path_factory):
    """The tests' caches (token stores, compiled steps) in a folder of their own, not the user's
    ~/.cache: a run's data files are temporary, and their stores would pile up there."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if before is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture(scope="module")
def steps_cache(tmp_path_factory):
    """One cache folder for a module's tests of compiled steps, so that each step is compiled once."""
    folder = tmp_path_factory.mktemp("xdg_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(folder))
        yield folder


@pytest.fixture
def two_threads():
    """torch on two threads for the test (decoding streams split them), its thread count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def copy_data(tmp_path_factory):
    """The copy task (digit strings -> themselves) as parallel text files, read-only for the tests:
    ``train.src``/``train.tgt`` (300 pairs) and ``valid.src``/``valid.tgt`` (20 pairs)."""
    folder = tmp_path_factory.mktemp("copy_task")
    for name, n, seed in (("train", 300, 0), ("valid", 20, 1)):
        pairs = copy(n, seed, max_length=5)
        (folder / f"{name}.src").write_text("\n".join(pairs.src) + "\n", encoding="utf-8")
        (folder / f"{name}.tgt").write_text("\n".join(pairs.tgt) + "\n", encoding="utf-8")
    return folder


@pytest.fixture
def no_decoding(monkeypatch):
    """Fails a test that decodes any image's pixels (Pillow reads headers when it opens a file, pixels
    when it loads it)."""
    import PIL.ImageFile

    def refuse(self):
        raise AssertionError("an image's pixels were decoded")

    monkeypatch.setattr(PIL.ImageFile.ImageFile, "load", refuse)
