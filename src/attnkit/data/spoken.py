"""Spoken dates and numbers, synthesised on the machine with espeak-ng: the speech-recognition task of
"Listen, Attend and Spell" (Chan et al., 2016) on data made in code, nothing downloaded.

    the twenty third of may nineteen sixty one        four hundred and twelve

A text is a date or a number as it is said (its words written out by num2words, lower case, no
hyphens), spoken by one of espeak-ng's voices: an accent (``en-us``, ``en-gb-scotland``, ...) with a
voice variant (``+m3``, ``+f2``: the speaker's pitch range, formants and breathiness), at a random speed
(words a minute) and pitch, with white noise added at a random signal-to-noise ratio. The variants
are split three ways: the validation and test utterances are spoken by variants never trained on (each
in every accent), so the test measures how a model hears voices it has never heard.

espeak-ng is a Debian package (``apt-get install espeak-ng``); without it, one line says so.
"""

from __future__ import annotations

import datetime as dt
import io
import random
import shutil
import subprocess
import wave
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from attnkit.errors import AttnkitError, DataError

ACCENTS = (
    "en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-029",
    "en-us-nyc",
)  # fmt: skip
VARIANTS = {  # espeak-ng's voice variants, by split: validation and test voices are never trained on
    "train": ("m1", "m2", "m3", "m5", "m6", "f1", "f2", "f4"),
    "valid": ("m4", "f3"),
    "test": ("m7", "f5"),
}
SPEEDS = (130, 200)  # words a minute (espeak-ng's default: 175)
PITCHES = (25, 75)  # espeak-ng's 0–99 (default 50)
SNR_DB = (15.0, 40.0)  # white noise this far below the speech's power
SAMPLE_RATE = 22050  # what espeak-ng writes
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september",
          "october", "november", "december")  # fmt: skip
# every character a transcript has: what a speech model's character tokenizer learns
CHARACTERS = " abcdefghijklmnopqrstuvwxyz"


@dataclass
class Utterance:
    """One synthesised utterance: what was said, by which voice, and the sound."""

    text: str
    voice: str  # espeak-ng's -v: accent+variant
    speed: int
    pitch: int
    snr_db: float
    audio: np.ndarray  # (samples,) float32 in [-1, 1], at SAMPLE_RATE


def _words(number: str) -> str:
    """num2words' text as plain words: no hyphens or commas."""
    return number.replace("-", " ").replace(",", "")


def spoken_text(rng: random.Random) -> str:
    """A date or a number as it is said: "the third of may nineteen sixty one", "may the third two
    thousand and four", "four hundred and twelve"."""
    from num2words import num2words

    kind = rng.random()
    if kind < 0.6:  # a date between 1900 and 2099
        start, end = dt.date(1900, 1, 1).toordinal(), dt.date(2099, 12, 31).toordinal()
        date = dt.date.fromordinal(rng.randint(start, end))
        day, month = num2words(date.day, to="ordinal"), MONTHS[date.month - 1]
        year = num2words(date.year, to="year")
        said = f"the {day} of {month} {year}" if rng.random() < 0.5 else f"{month} the {day} {year}"
        return _words(said)
    if kind < 0.8:
        return _words(num2words(rng.randint(0, 999)))
    return _words(num2words(rng.randint(1000, 99999)))


def require_espeak() -> str:
    """The espeak-ng program, or one line on how to install it."""
    found = shutil.which("espeak-ng")
    if found is None:
        raise AttnkitError(
            "the spoken dates are synthesised with espeak-ng, which is not installed: "
            "apt-get install espeak-ng (Debian, Ubuntu) or brew install espeak-ng (macOS)"
        )
    return found


def synthesise(text: str, voice: str, speed: int, pitch: int) -> np.ndarray:
    """``text`` spoken by espeak-ng's ``voice`` at ``speed`` words a minute and ``pitch`` (0–99):
    ``(samples,)`` float32 in [-1, 1] at :data:`SAMPLE_RATE`."""
    command = [require_espeak(), "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout", text]
    written = subprocess.run(command, capture_output=True, check=True).stdout
    with wave.open(io.BytesIO(written)) as sound:  # a header that says "as long as the stream is"
        samples = sound.readframes(sound.getnframes())
    return np.frombuffer(samples, dtype="<i2").astype(np.float32) / 32768


def with_noise(audio: np.ndarray, snr_db: float, rng: np.random.Generator) -> np.ndarray:
    """``audio`` with white noise ``snr_db`` below its mean power."""
    power = float(np.mean(audio.astype(np.float64) ** 2)) or 1e-10
    noise = rng.standard_normal(audio.shape) * np.sqrt(power / 10 ** (snr_db / 10))
    return (audio + noise).astype(np.float32)


def spoken_utterances(split: str, n: int, seed: int | list[int], workers: int = 4) -> list[Utterance]:
    """``n`` utterances of ``split`` (``train``, ``valid``, ``test``: each its own voices), the same for
    the same seed: texts, voices, speeds, pitches and noise are drawn from it."""
    return list(each_spoken_utterance(split, n, seed, workers))


def each_spoken_utterance(
    split: str, n: int, seed: int | list[int], workers: int = 4, chunk: int = 256
) -> Iterator[Utterance]:
    """:func:`spoken_utterances` one at a time, in order, synthesised ``chunk`` at a time: a reader that
    keeps only each one's features holds no more than ``chunk`` sounds (6,000 utterances of speech are
    1.6 GB as float32 samples, their log-mel features a fifth of that)."""
    if split not in VARIANTS:
        raise DataError(f"spoken utterances: split {split!r}; choose one of {sorted(VARIANTS)}")
    require_espeak()
    rng = random.Random(str(seed) + split)
    voices = [f"{accent}+{variant}" for accent in ACCENTS for variant in VARIANTS[split]]
    plans = [
        (
            spoken_text(rng),
            rng.choice(voices),
            rng.randint(*SPEEDS),
            rng.randint(*PITCHES),
            rng.uniform(*SNR_DB),
        )
        for _ in range(n)
    ]
    noise = np.random.default_rng(rng.randrange(2**32))
    with ThreadPoolExecutor(workers) as pool:  # each synthesis is a process of its own
        for start in range(0, n, chunk):
            part = plans[start : start + chunk]
            sounds = pool.map(lambda plan: synthesise(*plan[:4]), part)
            for (text, voice, speed, pitch, snr), sound in zip(part, sounds, strict=True):
                yield Utterance(text, voice, speed, pitch, snr, with_noise(sound, snr, noise))
