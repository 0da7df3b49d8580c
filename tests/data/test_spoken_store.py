"""Synthesised utterances kept as features: the second ask reads what the first made (nothing is made
again), other settings or another espeak-ng version are another file, and a file that does not read
back whole is made again."""

import torch

from attnkit.data import spoken_store
from attnkit.data.spoken_store import kept_or_made, spoken_path


def test_a_set_is_made_once_and_read_back_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(spoken_store, "espeak_version", lambda: "eSpeak NG text-to-speech: 1.51")
    made = []

    def make():
        made.append(1)
        features = [torch.randn(n, 4) for n in (5, 9, 2)]
        return features, ["one", "two thousand", "the third of may"], ["en-us+m1", "en-gb+f2", "en-029+m3"]

    settings = {"split": "test", "n": 3, "seed": 2, "n_mels": 4}
    first = kept_or_made(str(tmp_path), settings, make)
    second = kept_or_made(str(tmp_path), settings, make)
    assert len(made) == 1
    assert all(torch.equal(a, b) for a, b in zip(first[0], second[0], strict=True))
    assert first[1:] == second[1:]
    path = spoken_path(str(tmp_path), settings)
    assert path.exists() and path != spoken_path(str(tmp_path), {**settings, "seed": 3})
    monkeypatch.setattr(spoken_store, "espeak_version", lambda: "eSpeak NG text-to-speech: 1.52")
    assert spoken_path(str(tmp_path), settings) != path
    monkeypatch.setattr(spoken_store, "espeak_version", lambda: "eSpeak NG text-to-speech: 1.51")
    path.write_bytes(path.read_bytes()[:100])  # cut short, as a full disk might leave it
    third = kept_or_made(str(tmp_path), settings, make)
    assert len(made) == 2 and third[1] == first[1]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_what_is_planted_under_a_predictable_name_is_never_written_through_or_in_the_way(
    tmp_path, monkeypatch
):
    import os

    monkeypatch.setattr(spoken_store, "espeak_version", lambda: "eSpeak NG text-to-speech: 1.51")
    settings = {"split": "test", "n": 1, "seed": 2, "n_mels": 4}
    path = spoken_path(str(tmp_path), settings)
    path.parent.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine", encoding="utf-8")
    for pid in range(max(1, os.getpid() - 3), os.getpid() + 4):  # the names a process id would give
        (path.parent / f".{path.name}.{pid}").symlink_to(victim)
    (path.parent / f".{path.name}.{os.getpid()}").unlink()
    (path.parent / f".{path.name}.{os.getpid()}").mkdir()  # this process's own: a folder in the way
    kept_or_made(str(tmp_path), settings, lambda: ([torch.randn(3, 4)], ["one"], ["en-us+m1"]))
    assert victim.read_text(encoding="utf-8") == "mine" and path.is_file() and not path.is_symlink()
