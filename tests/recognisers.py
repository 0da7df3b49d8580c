"""Untrained speech recognisers saved as runs, and sounds as WAV files, for the tests of what reads
them (the speech explorer, the server): their transcripts need only be the model's own, so no speech
is synthesised."""

import io
import wave
from pathlib import Path

import numpy as np
import torch

from attnkit.checkpoint.folder import CheckpointContents, save_checkpoint
from attnkit.config import RunConfig
from attnkit.models import build_model, from_preset
from attnkit.tasks.speech import character_tokenizer

RATE = 16000  # samples a second


def untrained_recogniser(folder: Path, attention: str = "location", seed: int = 0) -> Path:
    """A small Listen-Attend-Spell model with random weights (``attention``: location, bahdanau, ...),
    spelling at most 12 characters, saved as a run in ``folder``."""
    tokenizer = character_tokenizer()
    torch.manual_seed(seed)
    config = from_preset("las-tiny", attention=attention, max_len=12)
    model = build_model(config, tokenizer.vocab_size).eval()
    contents = CheckpointContents(model, RunConfig.for_model(config).to_dict(), tokenizer.to_str())
    save_checkpoint(folder, 1, contents, is_best=True)
    return folder


def chirp(seconds: float, seed: int) -> np.ndarray:
    """A sound of ``seconds`` at :data:`RATE`: a tone sweeping up in pitch, then down, with some noise
    (bands that change over time, as speech's do)."""
    t = np.arange(int(seconds * RATE)) / RATE
    pitch = 300 + 2500 * np.abs(np.sin(np.pi * t / seconds))  # Hz
    noise = np.random.default_rng(seed).normal(0, 0.05, len(t))
    return (0.5 * np.sin(2 * np.pi * np.cumsum(pitch) / RATE) + noise).astype(np.float32)


def wav_bytes(samples: np.ndarray, rate: int = RATE) -> bytes:
    """``samples`` in [-1, 1] as a 16-bit mono WAV file."""
    written = io.BytesIO()
    with wave.open(written, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return written.getvalue()
