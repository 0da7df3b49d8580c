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
