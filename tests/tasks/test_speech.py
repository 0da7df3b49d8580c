"""Speech recognition on spoken dates through the one training loop and CLI: a Listen-Attend-Spell
model trains on synthesised utterances, its checkpoints hold its characters (tokenizer.json),
``attnkit evaluate`` scores held-out voices (CER, WER, monotone alignments), ``attnkit predict --audio``
transcribes WAV files as the model transcribes their features, and the task and the model ask for each
other."""

import re
import shutil
import wave

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attnkit.cli import app
from attnkit.config import load_run_config
from attnkit.data.audio import heard, read_wav
from attnkit.data.spoken import spoken_utterances
from attnkit.decode.transcripts import transcribe
from attnkit.errors import ConfigError
from attnkit.loading import load_for_inference
from tests.cli.checks import one_line_error

pytest.importorskip(
    "num2words", reason="the texts are written out by num2words: pip install 'attnkit[speech]'"
)
pytest.importorskip("jiwer", reason="the error rates come from jiwer: pip install 'attnkit[speech]'")
if shutil.which("espeak-ng") is None:
    pytest.skip("no espeak-ng to synthesise the speech: apt-get install espeak-ng", allow_module_level=True)

SHORT = [
    "model.arch=listen-attend-spell", "model.preset=las-tiny", "data.n_train=96", "data.n_valid=16",
    "train.batch_size=16", "train.schedule=constant", "train.warmup=0", "train.lr=3e-3", "train.max_steps=30",
    "train.eval_every=30", "model.max_len=40",
]  # fmt: skip


def _wav(path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


def test_a_speech_recogniser_trains_is_evaluated_and_transcribes_wav_files(tmp_path):
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--run-dir", str(run), *SHORT])
    assert result.exit_code == 0, result.output
    assert re.search(
        r"final validation: valid_loss [\d.]+, valid_ppl [\d.]+, valid_cer [\d.]+, valid_wer", result.stdout
    )
    model, tokenizer, config = load_for_inference(run)
    assert config.data.task == "speech" and config.model.arch == "listen-attend-spell"
    assert tokenizer.decode(tokenizer.encode("the third of may")) == "the third of may"
    result = CliRunner().invoke(app, ["evaluate", "--ckpt", str(run)])
    assert result.exit_code == 0, result.output
    said = r"CER [\d.]+%, WER [\d.]+%, monotone alignments [\d.]+%, on 16 test utterances by voices never"
    assert re.search(said, result.stdout), result.stdout
    plot = tmp_path / "alignments.png"
    result = CliRunner().invoke(app, ["evaluate", "--ckpt", str(run), "--plot", str(plot)])
    assert result.exit_code == 0 and f"alignments over the spectrograms: {plot}" in result.stdout, (
        result.output
    )
    assert plot.stat().st_size > 20_000  # three spectrograms, each over its alignment
    utterances = spoken_utterances("test", 2, seed=11)
    files = []
    for i, u in enumerate(utterances):
        files.append(tmp_path / f"said{i}.wav")
        _wav(files[-1], u.audio, 22050)
    assert config.model.sample_rate == 22050  # espeak-ng's rate, the synthesised set's, saved with the run
    features = [heard(read_wav(path), 22050) for path in files]  # as the files read back (16-bit)
    expected = transcribe(model, tokenizer, features, config.decode)
    result = CliRunner().invoke(
        app, ["predict", "--ckpt", str(run), *[a for f in files for a in ("--audio", str(f))]]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.split("\n")[:2] == expected
    notes = tmp_path / "notes.wav"
    notes.write_text("not a sound", encoding="utf-8")
    one_line_error(CliRunner().invoke(app, ["predict", "--ckpt", str(run), "--audio", str(notes)]),
                   r"notes.wav: not a WAV file this can read")  # fmt: skip
    one_line_error(CliRunner().invoke(app, ["predict", "--ckpt", str(run), "--text", "the third of may"]),
                   r"a speech recogniser reads sound, not text: give --audio FILE.wav")  # fmt: skip
    drafted = ["predict", "--ckpt", str(run), "--audio", str(files[0]), "decode.speculative=source"]
    one_line_error(
        CliRunner().invoke(app, drafted), r"decode\.speculative=source: a speech recogniser checks no drafts"
    )


def test_the_speech_task_and_the_recogniser_ask_for_each_other():
    config = load_run_config(None, ["model.arch=listen-attend-spell"])  # the recogniser's default task
    assert config.data.task == "speech" and config.train.eval_metric == "cer"
    with pytest.raises(ConfigError, match=r"listen-attend-spell"):
        load_run_config(None, ["data.task=speech"])  # the default model is a translation model
    with pytest.raises(ConfigError, match=r"model\.hard"):
        load_run_config(None, ["model.arch=listen-attend-spell", "model.hard=true"])


def test_an_alignment_is_monotone_when_no_peak_falls_more_than_one_annotation_back():
    from attnkit.tasks.speech import monotone

    def alignment(peaks):
        return torch.nn.functional.one_hot(torch.tensor(peaks), 10).float()  # (steps, S)

    assert monotone(alignment([0, 1, 1, 2, 4, 9]))
    assert monotone(alignment([0, 2, 1, 3]))  # one back: two characters of one annotation's neighbours
    assert not monotone(alignment([0, 3, 1, 4]))  # two back
    assert monotone(alignment([0, 1, 1]), slack=0) and not monotone(alignment([0, 2, 1]), slack=0)  # strictly
