"""Spoken dates and numbers: the texts are dates and numbers written out in words, the voices of the
three splits never meet, the same seed gives the same utterances (one at a time as all at once), the
noise is as far below the speech as planned, and without espeak-ng one line says how to install it."""

import re
import shutil

import numpy as np
import pytest

from attnkit.data import spoken
from attnkit.data.spoken import CHARACTERS, MONTHS, VARIANTS, spoken_utterances, with_noise
from attnkit.errors import AttnkitError

pytest.importorskip(
    "num2words", reason="the texts are written out by num2words: pip install 'attnkit[speech]'"
)
needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None, reason="no espeak-ng: apt-get install espeak-ng"
)


@needs_espeak
def test_utterances_say_dates_and_numbers_in_voices_of_their_own_split():
    train = spoken_utterances("train", 40, seed=3)
    test = spoken_utterances("test", 20, seed=3)
    date = re.compile(
        rf"(the \w+( \w+)? of ({'|'.join(MONTHS)})|({'|'.join(MONTHS)}) the \w+( \w+)?) [a-z ]+"
    )
    for u in train + test:
        assert set(u.text) <= set(CHARACTERS) and u.text == u.text.strip() and "  " not in u.text
        assert (
            date.fullmatch(u.text) or "thousand" in u.text or "hundred" in u.text or len(u.text.split()) <= 2
        )
        seconds = len(u.audio) / spoken.SAMPLE_RATE
        assert 0.3 < seconds < 8 and np.abs(u.audio).max() > 0.05  # something was said
    variant = lambda u: u.voice.split("+")[1]  # noqa: E731
    assert {variant(u) for u in train} <= set(VARIANTS["train"])
    assert {variant(u) for u in test} <= set(VARIANTS["test"])
    assert not set(VARIANTS["train"]) & (set(VARIANTS["valid"]) | set(VARIANTS["test"]))
    again = spoken_utterances("train", 40, seed=3)
    assert [u.text for u in again] == [u.text for u in train]
    np.testing.assert_array_equal(again[5].audio, train[5].audio)
    assert [u.text for u in spoken_utterances("train", 40, seed=4)] != [u.text for u in train]


@needs_espeak
def test_utterances_one_at_a_time_are_synthesised_a_chunk_at_a_time_and_are_the_same(monkeypatch):
    """A reader that keeps each utterance's features alone holds a chunk of sounds at most, not all."""
    whole = spoken_utterances("valid", 7, seed=2)
    said = []
    synthesise = spoken.synthesise
    monkeypatch.setattr(spoken, "synthesise", lambda *plan: said.append(plan[0]) or synthesise(*plan))
    each = spoken.each_spoken_utterance("valid", 7, seed=2, chunk=3)
    first = next(each)
    assert len(said) == 3  # the first chunk, and no more
    rest = list(each)
    assert len(said) == 7 and [u.text for u in [first, *rest]] == [u.text for u in whole]
    for one, other in zip([first, *rest], whole, strict=True):
        np.testing.assert_array_equal(one.audio, other.audio)  # the same noise too


def test_the_noise_is_as_far_below_the_speech_as_asked():
    rng = np.random.default_rng(0)
    speech = np.sin(np.linspace(0, 2000, 50_000)).astype(np.float32) * 0.4
    noisy = with_noise(speech, 20.0, rng)
    noise = noisy.astype(np.float64) - speech
    snr = 10 * np.log10(np.mean(speech.astype(np.float64) ** 2) / np.mean(noise**2))
    assert abs(snr - 20.0) < 0.2


def test_without_espeak_one_line_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(spoken.shutil, "which", lambda name: None)
    with pytest.raises(AttnkitError, match=r"apt-get install espeak-ng"):
        spoken_utterances("train", 2, seed=0)
