"""A speech recogniser as the server runs it: uploaded WAV files transcribed as ``attnkit predict
--audio`` transcribes files (resampled to the model's rate, their log-mel features, the task's
``infer``, the run's decode settings), and the speech explorer's page (viz/speech_explorer.py) for an
uploaded one.

An upload is checked from its header alone (data/audio.py: PCM at 8 to 96 kHz, whole samples, at least
two frames of features long), which tells how long it is, and so what it costs, before a feature is
computed; its features are computed on the batcher's worker. An utterance costs the batch its
annotations (one per ``model.reduction`` frames of 10 ms: 12 for the recipes' listener, so a 3-second
utterance is 25), as a sentence costs its tokens: ``--max-batch-tokens`` bounds both. How long an upload
may be is the server's ``--max-body-bytes`` (1 MiB by default: about 32 seconds of 16-bit sound at
16 kHz).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from attnkit.data.audio import Sound, heard, heard_frames, wav_from_bytes
from attnkit.serve.served import ReadsUploads, form_for_uploads


@dataclass
class ServedRecogniser(ReadsUploads):
    reading: ClassVar[str] = "audio"
    field: ClassVar[str] = "audio"
    example: ClassVar[str] = "curl -F audio=@hello.wav"
    output: ClassVar[str] = "transcript"
    unit: ClassVar[str] = "annotations"
    reads: ClassVar[str] = "transcribes speech"
    asks: ClassVar[str] = "upload a WAV file to see where the recogniser listens as it spells each character"
    upload_form: ClassVar[str] = form_for_uploads("audio", "audio/wav,.wav", "transcribe it")

    def read_upload(self, data: bytes, name: str) -> Sound:
        """An uploaded WAV file, its header and length checked; a one-line
        :class:`~attnkit.errors.DataError` naming ``name`` for what is not a WAV file this reads, or is
        too short for two frames of features."""
        sound = wav_from_bytes(data, name)
        heard_frames(sound, self.config.model.sample_rate)
        return sound

    def cost(self, upload: Sound) -> int:
        """The annotations the speller will attend to (from the file's length alone)."""
        return self.model.config.annotations(heard_frames(upload, self.config.model.sample_rate))

    def decode_input(self, upload: Sound) -> Tensor:
        """``(frames, n_mels)`` features at the model's sample rate."""
        return heard(upload, self.config.model.sample_rate, self.config.model.n_mels)

    def explore_upload(self, upload: Sound, name: str, base: str) -> str:
        """The speech explorer's page for an utterance, with the upload form on top."""
        from attnkit.viz.speech_explorer import speech_page, speech_view

        features = self.decoded(upload)
        view = speech_view(self.model, self.tokenizer, self.config.decode, features, self.checkpoint.name)
        form = self.upload_form.format(action=base)
        return speech_page(features, [view], f"transcript of {name} by {self.checkpoint.name}", form)
