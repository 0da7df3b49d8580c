"""Sound as the speech model hears it: the mel filters are HF transformers' HTK filter bank, the
features are the log of its mel spectrogram (HF's ``spectrogram``, same window and hop) normalised per
band, and WAV files of 8, 16 and 32 bits, mono or stereo, read as their samples; a file that is no WAV
is one line naming it."""

import wave

import numpy as np
import pytest
import torch

from attnkit.data.audio import log_mel, mel_filters, read_wav, wav_from_bytes
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
    read, rate = read_wav(path)
    assert rate == 8000 and read.dtype == np.float32 and read.shape == (4000,)
    np.testing.assert_allclose(read, samples, atol=1.5 / 2 ** (8 * width - 1))
    again, _ = wav_from_bytes(path.read_bytes(), "upload.wav")
    np.testing.assert_array_equal(again, read)


def test_what_is_not_a_readable_wav_is_one_line_naming_it(tmp_path):
    notes = tmp_path / "notes.wav"
    notes.write_text("not a sound", encoding="utf-8")
    with pytest.raises(DataError, match=r"notes.wav: not a WAV file this can read"):
        read_wav(notes)
    with pytest.raises(DataError, match=r"missing.wav: no such file"):
        read_wav(tmp_path / "missing.wav")
    short = tmp_path / "short.wav"
    _wav(short, np.zeros(10), 2, 1)
    with pytest.raises(DataError, match=r"short.wav: 10 samples, shorter than one 25 ms frame"):
        read_wav(short)
    assert torch.isfinite(log_mel(np.zeros(400, dtype=np.float32), 8000)).all()  # digital silence
