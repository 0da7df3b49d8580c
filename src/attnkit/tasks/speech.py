"""Speech recognition on spoken dates and numbers (``data.task: speech``): the task of the
Listen-Attend-Spell recogniser (``model.arch: listen-attend-spell``, models/listen_attend_spell.py).

The utterances are synthesised when a run first needs them (data/spoken.py, espeak-ng; then kept as
features under ``data.store``, data/spoken_store.py): ``data.n_train`` training utterances, fixed by the
run's seed (synthesis costs a minute for 8,000), and ``data.n_valid`` validation utterances and as many
test ones, spoken by voices never trained on. Or they are recorded speech: ``data.train: [train.tsv]``
(and ``data.valid``, ``data.test``) name transcript files of WAV files (data/transcribed.py), and the
characters are those of the training transcripts. Each becomes log-mel features (data/audio.py). A batch
is ``train.batch_size`` utterances of similar lengths, padded with zero frames, their transcripts as
``<s> y`` and ``y </s>`` (one token a character); the loss is the label-smoothed cross-entropy of the
characters. Validation reports loss and perplexity, and the character and word error rates of greedy
transcripts; the test adds how often the alignment is monotone (:func:`monotone_share`).
"""

from __future__ import annotations

import dataclasses
import functools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from attnkit.config import RunConfig
from attnkit.data.audio import log_mel
from attnkit.data.batching import consecutive, pad
from attnkit.data.spoken import CHARACTERS, SAMPLE_RATE, each_spoken_utterance
from attnkit.data.spoken_store import kept_or_made
from attnkit.data.tokenizer import Tokenizer
from attnkit.data.transcribed import transcribed_features
from attnkit.decode.transcripts import alignments_while_spelling, padded_frames, transcribe
from attnkit.errors import ConfigError, DataError
from attnkit.metrics import error_rates
from attnkit.models import unwrap
from attnkit.tasks.losses import generative_loss
from attnkit.tasks.protocol import Given, Scoring
from attnkit.tasks.validation import validation_loss

SORTED_BATCHES = 16  # an epoch's utterances are sorted by length within groups of this many batches


@dataclass
class SpeechBatch:
    frames: Tensor  # (B, T, n_mels): each utterance's features, zero frames after its end
    tgt_in: Tensor  # (B, L): <s> + transcript
    tgt_out: Tensor  # (B, L): transcript + </s>
    n_tokens: int  # characters (and </s>) that count towards the loss

    def to(self, device: torch.device | str) -> SpeechBatch:
        return SpeechBatch(
            self.frames.to(device), self.tgt_in.to(device), self.tgt_out.to(device), self.n_tokens
        )


@dataclass
class Spoken:
    """Utterances as the model hears them: features, and what was said by which voice."""

    features: list[Tensor]  # each (frames, n_mels)
    texts: list[str]
    voices: list[str]

    def __len__(self) -> int:
        return len(self.texts)


def speech_batch(spoken: Spoken, indices: list[int], tokenizer: Tokenizer) -> SpeechBatch:
    ids = tokenizer.encode_batch([spoken.texts[i] for i in indices])
    specials = tokenizer.specials
    return SpeechBatch(
        frames=padded_frames([spoken.features[i] for i in indices]),
        tgt_in=pad([[specials.bos, *t] for t in ids], specials.pad),
        tgt_out=pad([[*t, specials.eos] for t in ids], specials.pad),
        n_tokens=sum(len(t) + 1 for t in ids),
    )


def split_utterances(config: RunConfig, split: str) -> Spoken:
    """The ``train``, ``valid`` or ``test`` utterances of a run's config, as features: recorded ones
    where ``data.train`` names a transcript file (:func:`recorded_utterances`), else synthesised ones."""
    if config.data.train:
        return recorded_utterances(config, split)
    return synthesised_utterances(config, split)


def synthesised_utterances(config: RunConfig, split: str) -> Spoken:
    """The synthesised ``train`` utterances (``n_train``), or the ``valid``/``test`` ones (``n_valid``
    each), of a run's config: synthesised once, then read from ``data.store`` (data/spoken_store.py)."""
    d, n_mels = config.data, config.model.n_mels
    n = d.n_train if split == "train" else d.n_valid
    seed = config.train.seed + {"train": 0, "valid": 1, "test": 2}[split]

    def synthesised() -> tuple[list[Tensor], list[str], list[str]]:
        features, texts, voices = [], [], []
        for u in each_spoken_utterance(split, n, seed):  # each sound let go once it is heard
            features.append(log_mel(u.audio, SAMPLE_RATE, n_mels))
            texts.append(u.text)
            voices.append(u.voice)
        return features, texts, voices

    settings = {"split": split, "n": n, "seed": seed, "n_mels": n_mels}
    return Spoken(*kept_or_made(d.store, settings, synthesised))


def recorded_utterances(config: RunConfig, split: str) -> Spoken:
    """The utterances of the transcript file ``data.<split>`` names (data/transcribed.py). Without a
    ``data.valid`` file, the last ``data.valid_fraction`` of the training file's utterances are held out
    for validation (and not trained on); the test needs a file of its own."""
    d, model = config.data, config.model
    if split == "test" and not d.test:
        raise ConfigError("data.test: recorded speech is tested on a transcript file of its own: give one")
    name = (d.valid or d.train)[0] if split == "valid" else getattr(d, split)[0]
    features, texts = _transcribed(d.path(name), model.sample_rate, model.n_mels, _stamp(d.path(name)))
    if split != "test" and not d.valid:
        kept = len(texts) - max(1, int(len(texts) * d.valid_fraction))
        if kept < 1:
            message = "too few utterances to hold out data.valid_fraction for validation"
            raise DataError(f"{d.path(name)}: {message}")
        features, texts = (
            (features[:kept], texts[:kept]) if split == "train" else (features[kept:], texts[kept:])
        )
    return Spoken(features, texts, [""] * len(texts))  # the voices unknown


@functools.lru_cache(maxsize=1)
def _transcribed(
    path: Path, sample_rate: int, n_mels: int, stamp: tuple[int, int]
) -> tuple[list[Tensor], list[str]]:
    """:func:`~attnkit.data.transcribed.transcribed_features`, the last file's kept while its ``stamp``
    (:func:`_stamp`) is the same: the training file's held-out part is read once with the rest."""
    return transcribed_features(path, sample_rate, n_mels)


def _stamp(path: Path) -> tuple[int, int]:
    """When the file last changed, and its size (``(0, 0)`` for a missing one: its reader says so)."""
    try:
        found = path.stat()
    except OSError:
        return (0, 0)
    return (found.st_mtime_ns, found.st_size)


def character_tokenizer(texts: Sequence[str] = ()) -> Tokenizer:
    """One token a character: learned from the fixed list of the spoken dates' characters, and any other
    character of ``texts`` (recorded speech's training transcripts)."""
    characters = CHARACTERS + "".join(sorted(set("".join(texts)) - set(CHARACTERS)))
    return Tokenizer.train("char", [characters * 2], vocab_size=len(characters) + 16, min_frequency=1)


def monotone(weights: Tensor, slack: int = 1) -> bool:
    """Whether an alignment ``(steps, S)`` moves only forward: each step's most attended annotation no
    more than ``slack`` annotations before the previous step's. An annotation is 120 ms of speech,
    often two characters or more, whose peaks may swap between it and its neighbour; one of slack lets
    them, and no more."""
    peaks = weights.argmax(-1)
    return bool((peaks[1:] >= peaks[:-1] - slack).all())


@torch.no_grad()
def monotone_share(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    spoken: Spoken,
    transcripts: list[str],
    device: torch.device | str,
) -> float:
    """The share of ``spoken``'s utterances whose alignment, as the model spelled ``transcripts`` (its
    own), is :func:`monotone` over the characters it wrote."""
    ids, weights = alignments_while_spelling(unwrap(model), tokenizer, spoken.features, transcripts, device)
    return sum(monotone(weights[row, : len(written)]) for row, written in enumerate(ids)) / max(len(ids), 1)


class SpeechTask:
    """The trainer's view of spoken dates: batches, loss and validation (see the module docstring)."""

    unit: ClassVar[str] = "characters"
    scoring: ClassVar[Scoring] = Scoring(
        files=(), asks="it is evaluated on its own synthesised test utterances", decodes=True,
        holder="a speech recogniser",
    )  # fmt: skip

    def __init__(self, config: RunConfig, tokenizer: Tokenizer | None, echo: Callable[[str], None]) -> None:
        self.config = config
        if not config.data.train:  # synthesised: espeak-ng's rate, saved with the run
            config.model.sample_rate = SAMPLE_RATE
        began = time.perf_counter()
        self.train = split_utterances(config, "train")
        self.valid = split_utterances(config, "valid")
        self.tokenizer = tokenizer or character_tokenizer(self.train.texts if config.data.train else ())
        hours = sum(len(f) for f in self.train.features) / 100 / 3600  # a frame every 10 ms
        took = time.perf_counter() - began
        recorded = bool(config.data.train)
        made = f"read from {config.data.train[0]}" if recorded else "synthesised (or read from data.store)"
        held_out = "held out" if recorded else "voices never trained on"
        echo(
            f"utterances {made} in {took:.0f} s: {len(self.train):,} for training ({hours:.1f} hours of "
            f"speech), {len(self.valid):,} for validation ({held_out}); {self.tokenizer.vocab_size} tokens: "
            "the characters, the specials"
        )

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This epoch's batches: utterances shuffled, sorted by length within groups of
        :data:`SORTED_BATCHES` batches (less padding), the batches shuffled again."""
        size = self.config.train.batch_size
        rng = random.Random(self.config.train.seed * 1000 + epoch)
        order = list(range(len(self.train)))
        rng.shuffle(order)
        batches = []
        for start in range(0, len(order), size * SORTED_BATCHES):
            group = sorted(
                order[start : start + size * SORTED_BATCHES], key=lambda i: len(self.train.features[i])
            )
            batches += [group[i : i + size] for i in range(0, len(group), size)]
        rng.shuffle(batches)
        return batches

    def make_batch(self, indices: list[int]) -> SpeechBatch:
        return speech_batch(self.train, indices, self.tokenizer)

    def loss(self, model: torch.nn.Module, batch: SpeechBatch) -> tuple[Tensor, Tensor]:
        """Summed label-smoothed loss and NLL of the transcripts' characters, plus the guided attention
        loss while training (``model.guided_attention``; models/listen_attend_spell.py)."""
        pad_id = self.tokenizer.specials.pad
        loss, nll = generative_loss(
            model, (batch.frames, batch.tgt_in), batch.tgt_out, self.config.train.label_smoothing, pad_id
        )
        recogniser = unwrap(model)
        if recogniser.training:
            loss = loss + recogniser.attention_penalty(batch.tgt_out)
        return loss, nll.sum()

    def validate(self, model: torch.nn.Module, device: torch.device, autocast: Callable) -> dict[str, float]:
        """Loss and perplexity, then the error rates of greedy transcripts."""
        size = self.config.train.batch_size
        groups = consecutive(len(self.valid), size)
        batches = (speech_batch(self.valid, group, self.tokenizer) for group in groups)
        scores = validation_loss(self.loss, model, batches, device, autocast)
        plain = dataclasses.replace(self.config.decode, speculative="none")  # (it checks no drafts)
        heard = transcribe(
            unwrap(model), self.tokenizer, self.valid.features, plain, beam_size=1, device=device
        )
        cer, wer = error_rates(heard, self.valid.texts)
        return {**scores, "valid_cer": cer, "valid_wer": wer}

    @classmethod
    def infer(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        config: RunConfig,
        inputs: Sequence[Tensor],
        device: torch.device | str,
        where: str = "input",
        first: int = 1,
    ) -> list[str]:
        """Each utterance's transcript, by the run's decode settings; an utterance is its features
        ``(frames, n_mels)`` (data/audio.py's ``heard``, at ``model.sample_rate``)."""
        assert tokenizer is not None
        return transcribe(model, tokenizer, list(inputs), config.decode, device=device)

    @classmethod
    def score(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        config: RunConfig,
        given: Given,
        device: torch.device | str,
    ) -> list[str]:
        """Character and word error rates on the task's synthesised test utterances (voices never trained
        on), and how often the alignment is monotone."""
        assert tokenizer is not None
        test = split_utterances(config, "test")
        began = time.perf_counter()
        heard = transcribe(
            model, tokenizer, test.features, config.decode, beam_size=given.beam, device=device
        )
        cer, wer = error_rates(heard, test.texts)
        forward = monotone_share(model, tokenizer, test, heard, device)
        return [
            f"CER {100 * cer:.2f}%, WER {100 * wer:.2f}%, monotone alignments {100 * forward:.1f}%, on "
            f"{len(test)} test utterances "
            f"{f'of {config.data.test[0]}' if config.data.train else 'by voices never trained on'} "
            f"({time.perf_counter() - began:.1f} s)"
        ]
