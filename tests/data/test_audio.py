"""Sound as the speech model hears it: the mel filters are HF transformers' HTK filter bank, the
features are the log of its mel spectrogram (HF's ``spectrogram``, same window and hop) normalised per
band, and WAV files of 8, 16 and 32 bits, mono or stereo, read as their samples; sound at another rate
than the model's is resampled to it, so that the same sound recorded at 8, 22.05 or 44.1 kHz gives the
features it gives at 16 kHz; a file that is no WAV, declares a rate outside 8–96 kHz, is cut mid-sample
or is too short for the features is one line naming it, never a crash."""

import math
import re
import struct
import wave

import numpy as np
import pytest
import torch

from attnkit.data.audio import Sound, heard, heard_frames, log_mel, mel_filters, read_wav, wav_from_bytes
from attnkit.errors import DataError

audio_utils = pytest.importorskip("transformers.audio_utils", reason="HF transformers is the reference")


def test_the_mel_filters_are_the_htk_filter_bank():
    for rate, n_fft in ((22050, 1024), (16000, 512)):
        reference = audio_utils.mel_filter_bank(
            num_frequency_bins=n_fft // 2 + 1, num_mel_filters=40, min_frequency=0.0, max_frequency=8000.0,
            sampling_rate=rate, norm=None, mel_scale="htk",
        )  # fmt: skip
        np.testing.assert_allclose(mel_filters(rate, n_fft).numpy(), reference, atol=1e-6)


def test_the_features_are_the_normalised_log_mel_spectrogram():
    rate = 16000
    t = np.arange(rate) / rate  # a second: a rising tone in noise
    samples = 0.3 * np.sin(2 * np.pi * (300 + 400 * t) * t) + 0.01 * np.random.default_rng(0).standard_normal(
        rate
    )
    window = audio_utils.window_function(400, "hann", periodic=True, frame_length=512, center=True)
    filters = audio_utils.mel_filter_bank(
        num_frequency_bins=257, num_mel_filters=40, min_frequency=0.0, max_frequency=8000.0,
        sampling_rate=rate, norm=None, mel_scale="htk",
    )  # fmt: skip
    power = audio_utils.spectrogram(
        samples.astype(np.float64),
        window,
        frame_length=512,
        hop_length=160,
        fft_length=512,
        power=2.0,
        center=False,
        mel_filters=filters,
        mel_floor=1e-30,
    )  # fmt: skip  (40, frames)
    bands = np.log(power.T + 1e-10)
    expected = (bands - bands.mean(0)) / bands.std(0, ddof=1)
    features = log_mel(samples.astype(np.float32), rate)
    assert features.shape == expected.shape == (97, 40)  # 1 + (16000 - 512) // 160 frames
    np.testing.assert_allclose(features.numpy(), expected, atol=2e-3)


def _wav(path, samples: np.ndarray, width: int, channels: int, rate: int = 8000) -> None:
    kinds = {1: lambda x: (x * 127 + 128).astype(np.uint8), 2: lambda x: (x * 32767).astype("<i2"),
             4: lambda x: (x * 2147483647).astype("<i4")}  # fmt: skip
    frames = np.repeat(samples[:, None], channels, 1) if channels > 1 else samples
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        out.writeframes(kinds[width](frames).tobytes())


@pytest.mark.parametrize(("width", "channels"), [(1, 1), (2, 1), (2, 2), (4, 1)])
def test_a_wav_file_reads_as_its_samples(tmp_path, width, channels):
    samples = np.sin(np.linspace(0, 40, 4000)) * 0.5
    path = tmp_path / "tone.wav"
    _wav(path, samples, width, channels)
    sound = read_wav(path)
    read = sound.samples()
    assert sound.rate == 8000 and sound.frames == 4000 and sound.seconds == 0.5
    assert read.dtype == np.float32 and read.shape == (4000,)
    np.testing.assert_allclose(read, samples, atol=1.5 / 2 ** (8 * width - 1))
    again = wav_from_bytes(path.read_bytes(), "upload.wav").samples()
    np.testing.assert_array_equal(again, read)


def test_what_is_not_a_readable_wav_is_one_line_naming_it(tmp_path):
    notes = tmp_path / "notes.wav"
    notes.write_text("not a sound", encoding="utf-8")
    with pytest.raises(DataError, match=r"notes.wav: not a WAV file this can read"):
        read_wav(notes)
    with pytest.raises(DataError, match=r"missing.wav: no such file"):
        read_wav(tmp_path / "missing.wav")
    assert torch.isfinite(log_mel(np.zeros(400, dtype=np.float32), 8000)).all()  # digital silence


def _riff(
    pcm: bytes, rate: int = 16000, width: int = 2, riff: int | None = None, declared: int | None = None
):
    """A WAV file written by hand, so that its sizes can lie: ``riff`` the RIFF chunk's size, ``declared``
    the data chunk's."""
    fmt = struct.pack("<HHIIHH", 1, 1, rate, (rate * width) % 2**32, width, 8 * width)
    data = b"data" + struct.pack("<I", len(pcm) if declared is None else declared) + pcm
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + data
    return b"RIFF" + struct.pack("<I", len(body) if riff is None else riff) + body


PCM = (np.sin(np.arange(16000) / 5) * 10000).astype("<i2").tobytes()  # a second at 16 kHz


@pytest.mark.parametrize(
    ("wav", "said"),
    [
        (_riff(PCM, rate=100), "a sample rate of 100 Hz; this reads 8,000 to 96,000 Hz"),
        (_riff(PCM, rate=40), "a sample rate of 40 Hz"),  # (a hop of 0 samples: a crash before)
        (_riff(PCM, rate=0), "a sample rate of 0 Hz"),
        (_riff(PCM, rate=4_000_000_000), "a sample rate of 4,000,000,000 Hz"),
        (_riff(PCM[:2001], declared=10**6), "its sound stops mid-sample (2,001 bytes of 2-byte samples"),
        (_riff(PCM, riff=101), "its sound stops mid-sample"),  # a data chunk past the RIFF chunk's end
        (_riff(PCM)[:30], "not a WAV file this can read"),
        (_riff(PCM[:3000], width=3), "24-bit samples; this reads 8-, 16- and 32-bit PCM"),
    ],
    ids=["100 Hz", "40 Hz", "0 Hz", "4 GHz", "cut mid-sample", "past the RIFF size", "cut header", "24 bits"],
)
def test_a_malformed_wav_or_an_absurd_rate_is_one_line_naming_it(wav, said):
    with pytest.raises(DataError, match=f"^upload.wav: {re.escape(said)}"):
        wav_from_bytes(wav, "upload.wav")


@pytest.mark.parametrize("samples", [0, 160, 450, 511, 600])
def test_a_clip_too_short_for_two_frames_of_features_is_one_line(samples):
    sound = wav_from_bytes(_riff(PCM[: 2 * samples]), "click.wav")  # 450: longer than the 25 ms window,
    # shorter than the 32 ms FFT it is padded to (torch.stft failed on it); 600: one frame, no spread
    with pytest.raises(DataError, match=r"^click.wav: \d+ ms of sound, shorter than the 42 ms that 2 frames"):
        heard(sound, 16000)
    with pytest.raises(DataError, match=r"^click.wav: "):
        heard_frames(sound, 16000)
    assert heard_frames(wav_from_bytes(_riff(PCM[:1344]), "x"), 16000) == 2  # 672 samples: 512 + 160


def _tones(rate: int) -> Sound:
    """A second of a gliding tone and a fixed one (all below 4 kHz), recorded at ``rate``."""
    t = np.arange(rate) / rate
    pitch = 300 + 1500 * np.abs(np.sin(np.pi * t))
    x = 0.4 * np.sin(2 * np.pi * np.cumsum(pitch) / rate) + 0.2 * np.sin(2 * np.pi * 2500 * t)
    return Sound("tones.wav", (x * 32767).astype("<i2").tobytes(), 2, 1, rate)


@pytest.mark.parametrize("rate", [8000, 22050, 44100])
def test_sound_at_another_rate_is_heard_as_the_same_sound_at_the_models(rate):
    at_16k = heard(_tones(16000), 16000)
    # the bands below 3 kHz, where the sound is (the rest hold only noise, whatever the rate)
    to_mel = lambda hz: 2595 * math.log10(1 + hz / 700)  # noqa: E731
    peaks = 700 * (10 ** (np.linspace(0, to_mel(8000), 42)[1:-1] / 2595) - 1)
    low = np.flatnonzero(peaks < 3000)
    resampled = heard(_tones(rate), 16000)
    assert resampled.shape == at_16k.shape == (97, 40)  # the model's frames, whatever the file's rate
    assert (resampled - at_16k)[:, low].abs().mean() < 0.2
    as_it_came = log_mel(_tones(rate).samples(), rate)  # what was done before: other bands, other frames
    frames = min(len(as_it_came), 97)
    assert (as_it_came[:frames] - at_16k[:frames])[:, low].abs().mean() > 0.2
