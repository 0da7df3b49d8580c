"""Sound as a speech model hears it: WAV files read, and log-mel filterbank features.

The features are those of Listen, Attend and Spell (Chan et al., 2016, §4: 40-dimensional log-mel
filter banks, a frame every 10 ms): the signal cut into 25 ms Hann-windowed frames every 10 ms, the power
spectrum of each (``torch.stft``) pooled into ``N_MELS`` triangular bands equally spaced on the mel
scale (the HTK formula, up to 8 kHz), its logarithm, then each band normalised to zero mean and unit
variance over the utterance (cepstral mean and variance normalisation: a louder recording, or another
microphone, shifts every frame alike). A frame of features is ``N_MELS`` numbers; an utterance is
``(frames, N_MELS)``.
"""

from __future__ import annotations

import io
import math
import wave
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from torch import Tensor

from attnkit.errors import DataError

N_MELS = 40
WINDOW_S, HOP_S = 0.025, 0.010
TOP_HZ = 8000.0
FLOOR = 1e-10  # added to the band energies before the logarithm (digital silence)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A WAV file's samples as ``(samples,)`` float32 in [-1, 1] (channels averaged) and its sample rate:
    8-, 16- and 32-bit PCM. A file that is not one is a one-line error naming it."""
    try:
        return _samples(path, str(path))
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None


def wav_from_bytes(data: bytes, name: str) -> tuple[np.ndarray, int]:
    """A WAV file's bytes (an upload) as :func:`read_wav` reads a file; errors name it ``name``."""
    return _samples(io.BytesIO(data), name)


def _samples(source: Path | BinaryIO, name: str) -> tuple[np.ndarray, int]:
    try:
        with wave.open(source if not isinstance(source, Path) else str(source)) as sound:
            width, channels, rate = sound.getsampwidth(), sound.getnchannels(), sound.getframerate()
            raw = sound.readframes(sound.getnframes())  # (a streamed header's count: what is there)
    except (wave.Error, EOFError) as error:
        raise DataError(f"{name}: not a WAV file this can read ({error})") from None
    kinds = {1: ("u1", 128.0, 128.0), 2: ("<i2", 0.0, 32768.0), 4: ("<i4", 0.0, 2147483648.0)}
    if width not in kinds:
        raise DataError(f"{name}: {8 * width}-bit samples; this reads 8-, 16- and 32-bit PCM")
    kind, offset, scale = kinds[width]
    samples = (np.frombuffer(raw, dtype=kind).astype(np.float32) - offset) / scale
    samples = samples[: len(samples) // channels * channels].reshape(-1, channels).mean(1)
    if len(samples) < rate * WINDOW_S:
        raise DataError(f"{name}: {len(samples)} samples, shorter than one {WINDOW_S * 1000:.0f} ms frame")
    return samples, rate


def mel_filters(sample_rate: int, n_fft: int, n_mels: int = N_MELS, top_hz: float = TOP_HZ) -> Tensor:
    """``(n_fft // 2 + 1, n_mels)`` triangular filters, their peaks equally spaced on the mel scale
    ``m = 2595 log10(1 + f / 700)`` from 0 to ``top_hz`` (at most half the sample rate)."""
    top = min(top_hz, sample_rate / 2)
    to_mel = lambda hz: 2595 * math.log10(1 + hz / 700)  # noqa: E731
    mels = torch.linspace(0, to_mel(top), n_mels + 2, dtype=torch.float64)
    edges = 700 * (10 ** (mels / 2595) - 1)  # (n_mels + 2,) Hz: each band's left edge, peak, right edge
    bins = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)  # (F,) Hz
    rising = (bins[:, None] - edges[None, :-2]) / (edges[1:-1] - edges[:-2])  # (F, n_mels)
    falling = (edges[None, 2:] - bins[:, None]) / (edges[2:] - edges[1:-1])
    return torch.clamp(torch.minimum(rising, falling), min=0).float()


def log_mel(samples: np.ndarray, sample_rate: int, n_mels: int = N_MELS) -> Tensor:
    """``(frames, n_mels)`` normalised log-mel features of ``samples`` (see the module docstring)."""
    window, hop = round(WINDOW_S * sample_rate), round(HOP_S * sample_rate)
    n_fft = 1 << (window - 1).bit_length()  # the next power of two
    signal = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))
    spectrum = torch.stft(
        signal, n_fft, hop, window, torch.hann_window(window), center=False, return_complex=True
    )  # fmt: skip  (F, frames)
    power = spectrum.abs().square().T  # (frames, F)
    bands = torch.log(power @ mel_filters(sample_rate, n_fft, n_mels) + FLOOR)  # (frames, n_mels)
    return (bands - bands.mean(0)) / bands.std(0).clamp(min=1e-5)
