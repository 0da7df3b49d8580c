"""Recorded speech read from a folder: WAV files and a transcript file that names them, what ``data.task:
speech`` trains on (``data.train: [train.tsv]``, ``data.valid``, ``data.test``) in place of the
synthesised dates.

A transcript file is UTF-8 text, one utterance a line: the WAV file (its path relative to the
transcript file's folder, or absolute), a tab, and what is said in it::

    clips/0001.wav	the birch canoe slid on the smooth planks
    clips/0002.wav	glue the sheet to the dark blue background

Blank lines are skipped. A line without its tab or its words, or naming a file that is not a WAV file
this reads (data/audio.py: 8-, 16- or 32-bit PCM at 8 to 96 kHz, at least two frames of features long),
is one error naming the transcript file, the line and the WAV file. Each file is resampled to the
model's sample rate (``model.sample_rate``) before its features are computed.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from attnkit.data.audio import heard, read_wav
from attnkit.data.readers import read_lines
from attnkit.errors import DataError


def read_transcripts(path: Path) -> list[tuple[int, Path, str]]:
    """Each utterance of the transcript file ``path``: its line number, its WAV file's path and its
    words."""
    utterances = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        sound, tab, words = line.partition("\t")
        if not tab or not sound.strip() or not words.strip():
            raise DataError(f"{path}:{number}: expected 'FILE.wav<TAB>transcript'; got {line[:60]!r}")
        utterances.append((number, path.parent / sound.strip(), words.strip()))
    return utterances


def transcribed_features(path: Path, sample_rate: int, n_mels: int) -> tuple[list[Tensor], list[str]]:
    """The log-mel features ``(frames, n_mels)`` of each WAV file the transcript file ``path`` names, at
    ``sample_rate``, and its transcript, in the file's order."""
    features, texts = [], []
    for number, sound, words in read_transcripts(path):
        try:
            features.append(heard(read_wav(sound), sample_rate, n_mels))
        except DataError as error:
            raise DataError(f"{path}:{number}: {error}") from None
        texts.append(words)
    return features, texts
