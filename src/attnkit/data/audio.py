"""Sound as a speech model hears it: WAV files read, and log-mel filterbank features.

The features are those of Listen, Attend and Spell (Chan et al., 2016, §4: 40-dimensional log-mel
filter banks, a frame every 10 ms): the signal cut into 25 ms Hann-windowed frames every 10 ms, the power
spectrum of each (``torch.stft``) pooled into ``N_MELS`` triangular bands equally spaced on the mel
scale (the HTK formula, up to 8 kHz), its logarithm, then each band normalised to zero mean and unit
variance over the utterance (cepstral mean and variance normalisation: a louder recording, or another
microphone, shifts every frame alike). A frame of features is ``N_MELS`` numbers; an utterance is
``(frames, N_MELS)``.

A model hears sound at the sample rate it was trained on (``model.sample_rate``: 22,050 Hz for the
synthesised dates, 16,000 by default for recorded speech): :func:`heard` resamples a file at another
rate first, since the same filterbank over a file at 8 kHz would stop at 4 kHz and give other features.
A WAV file is read in two steps: its header and samples checked (:func:`wav_from_bytes`: PCM of 8, 16 or
32 bits, a rate of :data:`MIN_RATE` to :data:`MAX_RATE` Hz, whole samples), which tells its length, and
so what it will cost, before any feature is computed; then :func:`heard`. A file that breaks any of
these is a one-line error naming it.
"""

from __future__ import annotations

import io
import math
import struct
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnkit.errors import AttnkitError, DataError

N_MELS = 40
WINDOW_S, HOP_S = 0.025, 0.010
TOP_HZ = 8000.0
FLOOR = 1e-10  # added to the band energies before the logarithm (digital silence)


MIN_RATE, MAX_RATE = 8_000, 96_000  # the sample rates a WAV file may declare, in Hz
MIN_FRAMES = 2  # frames of features a sound must make at least (one has no spread to normalise by)


@dataclass(frozen=True)
class Sound:
    """A WAV file read and checked, its samples not yet converted: ``pcm`` its whole frames of
    ``width``-byte samples, ``channels`` interleaved, ``rate`` a second. Its length is known from these
    alone, so what it will cost is known before a feature is computed."""

    name: str  # what errors call it (a path, an upload's file name)
    pcm: bytes
    width: int
    channels: int
    rate: int

    @property
    def frames(self) -> int:
        """Sample frames (one sample of each channel)."""
        return len(self.pcm) // (self.width * self.channels)

    @property
    def seconds(self) -> float:
        return self.frames / self.rate

    def samples(self) -> np.ndarray:
        """``(frames,)`` float32 in [-1, 1], the channels averaged."""
        kind, offset, scale = SAMPLE_KINDS[self.width]
        samples = (np.frombuffer(self.pcm, dtype=kind).astype(np.float32) - offset) / scale
        return samples.reshape(-1, self.channels).mean(1)


# sample width in bytes -> (numpy type, the value of silence, full scale): 8-bit PCM is unsigned
SAMPLE_KINDS = {1: ("u1", 128.0, 128.0), 2: ("<i2", 0.0, 32768.0), 4: ("<i4", 0.0, 2147483648.0)}


def read_wav(path: Path) -> Sound:
    """A WAV file of 8-, 16- or 32-bit PCM at :data:`MIN_RATE` to :data:`MAX_RATE` Hz; a file that is not
    one is a one-line error naming it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as error:
        raise DataError(f"{path}: cannot be read ({error.strerror or error})") from None
    return wav_from_bytes(data, str(path))


def wav_from_bytes(data: bytes, name: str) -> Sound:
    """A WAV file's bytes (an upload) as :func:`read_wav` reads a file; errors name it ``name``. Reads
    the header and slices the samples; converts nothing."""
    try:
        with wave.open(io.BytesIO(data)) as sound:
            width, channels, rate = sound.getsampwidth(), sound.getnchannels(), sound.getframerate()
            pcm = sound.readframes(sound.getnframes())  # (a streamed header's count: what is there)
    except (wave.Error, EOFError, ValueError, struct.error) as error:
        raise DataError(
            f"{name}: not a WAV file this can read ({str(error) or type(error).__name__})"
        ) from None
    if width not in SAMPLE_KINDS:
        raise DataError(f"{name}: {8 * width}-bit samples; this reads 8-, 16- and 32-bit PCM")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise DataError(f"{name}: a sample rate of {rate:,} Hz; this reads {MIN_RATE:,} to {MAX_RATE:,} Hz")
    if len(pcm) % (width * channels):
        cut = (
            f"its sound stops mid-sample ({len(pcm):,} bytes of {width}-byte samples in {channels} channels)"
        )
        raise DataError(f"{name}: {cut}: the file is cut short or malformed")
    return Sound(name, pcm, width, channels, rate)


def heard_frames(sound: Sound, sample_rate: int) -> int:
    """How many frames of features :func:`heard` makes of ``sound`` at ``sample_rate``, known from its
    length alone; a sound of fewer than :data:`MIN_FRAMES` is a one-line error naming it."""
    up, down = _ratio(sound.rate, sample_rate)
    samples = -(-sound.frames * up // down)  # what resampling to sample_rate makes of it
    window, hop = round(WINDOW_S * sample_rate), round(HOP_S * sample_rate)
    n_fft = _fft_size(window)
    frames = 0 if samples < n_fft else 1 + (samples - n_fft) // hop  # as torch.stft frames it (center=False)
    if frames < MIN_FRAMES:
        least = f"the {(n_fft + hop) / sample_rate * 1000:.0f} ms that {MIN_FRAMES} frames of features take"
        raise DataError(f"{sound.name}: {sound.seconds * 1000:.0f} ms of sound, shorter than {least}")
    return frames


def heard(sound: Sound, sample_rate: int, n_mels: int = N_MELS) -> Tensor:
    """``(frames, n_mels)`` features of ``sound`` as a model trained on sound at ``sample_rate`` hears
    it: resampled to that rate (a polyphase filter, scipy's ``resample_poly``) where it is at another,
    then :func:`log_mel`. A sound of fewer than :data:`MIN_FRAMES` is a one-line error naming it."""
    heard_frames(sound, sample_rate)
    samples = sound.samples()
    if sound.rate != sample_rate:
        samples = _resampled(samples, sound.rate, sample_rate)
    return log_mel(samples, sample_rate, n_mels)


def _resampled(samples: np.ndarray, rate: int, sample_rate: int) -> np.ndarray:
    try:
        from scipy.signal import resample_poly
    except ImportError:
        said = f"sound at {rate:,} Hz for a model of {sample_rate:,} Hz is resampled by scipy"
        raise AttnkitError(f"{said}: pip install 'attnkit[speech]'") from None
    return resample_poly(samples, *_ratio(rate, sample_rate)).astype(np.float32)


def _ratio(rate: int, sample_rate: int) -> tuple[int, int]:
    """``(up, down)``: ``rate`` to ``sample_rate`` as the smallest whole ratio."""
    common = math.gcd(rate, sample_rate)
    return sample_rate // common, rate // common


def _fft_size(window: int) -> int:
    """The FFT's length for a window of ``window`` samples: the next power of two."""
    return 1 << (window - 1).bit_length()


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
    n_fft = _fft_size(window)
    signal = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))
    spectrum = torch.stft(
        signal, n_fft, hop, window, torch.hann_window(window), center=False, return_complex=True
    )  # fmt: skip  (F, frames)
    power = spectrum.abs().square().T  # (frames, F)
    bands = torch.log(power @ mel_filters(sample_rate, n_fft, n_mels) + FLOOR)  # (frames, n_mels)
    return (bands - bands.mean(0)) / bands.std(0).clamp(min=1e-5)
