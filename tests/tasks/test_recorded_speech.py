"""Recorded speech (``data.task: speech`` with ``data.train: [train.tsv]``): a recogniser trains on WAV
files a transcript file names, its characters those of the transcripts (capitals and punctuation
too), validates on a held-out share of them, is tested on a transcript file of its own and transcribes
what ``attnkit predict --audio`` is given; a transcript file that is wrong is one line naming its line."""

import re

import pytest
from typer.testing import CliRunner

from attnkit.cli import app
from attnkit.config import load_run_config
from attnkit.data.audio import heard, read_wav
from attnkit.data.transcribed import read_transcripts, transcribed_features
from attnkit.decode.transcripts import transcribe
from attnkit.errors import ConfigError, DataError
from attnkit.loading import load_for_inference
from attnkit.tasks.speech import split_utterances
from tests.cli.checks import one_line_error
from tests.recognisers import chirp, wav_bytes

pytest.importorskip("jiwer", reason="the error rates come from jiwer: pip install 'attnkit[speech]'")

SAID = ["Tone up!", "tone down", "a long tone, then silence", "two tones"]


def _recordings(folder, name: str, n: int, seed: int) -> str:
    """``n`` sounds as WAV files under ``folder/clips`` and the transcript file ``folder/name`` naming
    them (with a blank line among them): the name, relative to ``folder``."""
    (folder / "clips").mkdir(exist_ok=True)
    lines = []
    for i in range(n):
        clip = f"clips/{name}-{i}.wav"
        (folder / clip).write_bytes(wav_bytes(chirp(0.4 + 0.1 * (i % 4), seed + i)))
        lines += [f"{clip}\t{SAID[i % 4]}", *([""] if i == 2 else [])]
    (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return name


def test_a_recogniser_trains_on_recorded_speech_and_is_tested_on_a_file_of_its_own(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    train, test = _recordings(data, "train.tsv", 20, 0), _recordings(data, "test.tsv", 4, 100)
    settings = [
        "model.arch=listen-attend-spell", "model.preset=las-tiny", f"data.dir={data}",
        f"data.train=[{train}]", f"data.test=[{test}]", "data.valid_fraction=0.2", "train.batch_size=8",
        "train.max_steps=4", "train.eval_every=4", "model.max_len=30",
    ]  # fmt: skip
    config = load_run_config(None, settings)
    assert [len(split_utterances(config, split)) for split in ("train", "valid", "test")] == [16, 4, 4]
    assert split_utterances(config, "valid").texts == SAID  # the last fifth of the training file
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--run-dir", str(run), *settings])
    assert result.exit_code == 0, result.output
    read = rf"utterances read from {train} in \d+ s: 16 for training .*, 4 for validation \(held out\)"
    assert re.search(read, result.stdout), result.stdout
    model, tokenizer, config = load_for_inference(run)
    for text in SAID:  # every character of the transcripts is a token of its own
        assert tokenizer.decode(tokenizer.encode(text)) == text and len(tokenizer.encode(text)) == len(text)
    result = CliRunner().invoke(app, ["evaluate", "--ckpt", str(run)])
    assert result.exit_code == 0, result.output
    scored = rf"CER [\d.]+%, WER [\d.]+%, monotone alignments [\d.]+%, on 4 test utterances of {test}"
    assert re.search(scored, result.stdout), result.stdout
    clip = data / "clips" / "test.tsv-1.wav"
    result = CliRunner().invoke(app, ["predict", "--ckpt", str(run), "--audio", str(clip)])
    assert result.exit_code == 0, result.output
    assert config.model.sample_rate == 16000  # recorded speech: the default rate, saved with the run
    expected = transcribe(model, tokenizer, [heard(read_wav(clip), 16000)], config.decode)
    assert result.stdout.split("\n")[:1] == expected


def test_a_transcript_file_reads_as_its_lines_and_what_is_wrong_is_one_line_naming_it(tmp_path):
    name = _recordings(tmp_path, "said.tsv", 5, 0)
    read = read_transcripts(tmp_path / name)
    assert [(line, path.name, words) for line, path, words in read] == [
        (1, "said.tsv-0.wav", SAID[0]), (2, "said.tsv-1.wav", SAID[1]), (3, "said.tsv-2.wav", SAID[2]),
        (5, "said.tsv-3.wav", SAID[3]), (6, "said.tsv-4.wav", SAID[0]),
    ]  # fmt: skip
    features, texts = transcribed_features(tmp_path / name, 16000, 40)
    assert texts == [SAID[i % 4] for i in range(5)] and features[1].shape == (47, 40)  # 0.5 s
    bad = tmp_path / "bad.tsv"
    for content, said in (
        ("clips/said.tsv-0.wav the words\n", r"bad.tsv:1: expected 'FILE.wav<TAB>transcript'"),
        ("clips/said.tsv-0.wav\t  \n", r"bad.tsv:1: expected 'FILE.wav<TAB>transcript'"),
        ("clips/said.tsv-0.wav\tfine\n\nclips/gone.wav\tlost\n", r"bad.tsv:3: .*gone.wav: no such file"),
        ("said.tsv\tnot a sound\n", r"bad.tsv:1: .*said.tsv: not a WAV file this can read"),
    ):
        bad.write_text(content, encoding="utf-8")
        with pytest.raises(DataError, match=said):
            transcribed_features(bad, 16000, 40)
    settings = ["model.arch=listen-attend-spell", f"data.dir={tmp_path}", f"data.train=[{name}]"]
    with pytest.raises(ConfigError, match=r"data.test: recorded speech is tested on a transcript file"):
        split_utterances(load_run_config(None, settings), "test")
    one_line_error(
        CliRunner().invoke(
            app,
            [
                "train",
                "--run-dir",
                str(tmp_path / "run"),
                *settings,
                "data.train=[bad.tsv]",
                "train.max_steps=1",
            ],
        ),
        r"bad.tsv:1: .*said.tsv: not a WAV file this can read",
    )


def test_a_malformed_or_short_wav_in_a_transcript_file_is_one_line_naming_line_and_file(tmp_path):
    _recordings(tmp_path, "said.tsv", 3, 0)
    sound = wav_bytes(chirp(0.5, 1))
    clips = {
        # 16-bit samples cut on an odd byte, the data chunk saying it holds more than the file has
        "odd.wav": sound[:40] + (10**6).to_bytes(4, "little") + sound[44:1001],
        "short.wav": wav_bytes(chirp(0.028, 1)),  # 448 samples: past the 25 ms window, short of the FFT's
        "slow.wav": wav_bytes(chirp(0.5, 1), rate=40),  # a hop of 0 samples at 40 Hz
    }
    said = {
        "odd.wav": r"odd.wav: its sound stops mid-sample",
        "short.wav": r"short.wav: 28 ms of sound, shorter than the 42 ms that 2 frames of features take",
        "slow.wav": r"slow.wav: a sample rate of 40 Hz; this reads 8,000 to 96,000 Hz",
    }
    for clip, data in clips.items():
        (tmp_path / "clips" / clip).write_bytes(data)
        bad = tmp_path / "bad.tsv"
        bad.write_text(f"clips/said.tsv-0.wav\tfine\nclips/{clip}\tbroken\n", encoding="utf-8")
        with pytest.raises(DataError, match=rf"^{re.escape(str(bad))}:2: \S*clips/{said[clip]}"):
            transcribed_features(bad, 16000, 40)
        settings = ["model.arch=listen-attend-spell", f"data.dir={tmp_path}", "data.train=[bad.tsv]"]
        result = CliRunner().invoke(app, ["train", "--run-dir", str(tmp_path / f"run-{clip}"), *settings,
                                          "train.max_steps=1"])  # fmt: skip
        one_line_error(result, rf"bad.tsv:2: \S*clips/{said[clip]}")


def test_recorded_speech_at_another_rate_is_heard_at_the_models(tmp_path):
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "slow.wav").write_bytes(wav_bytes(chirp(0.5, 3)[::2], rate=8000))
    (tmp_path / "said.tsv").write_text("clips/slow.wav\tslow\n", encoding="utf-8")
    (features,), _ = transcribed_features(tmp_path / "said.tsv", 16000, 40)
    assert features.shape == (47, 40)  # half a second at 16 kHz, not at 8 kHz (48 frames, other bands)
    assert features.equal(heard(read_wav(tmp_path / "clips" / "slow.wav"), 16000))


def test_the_training_file_is_read_once_with_its_held_out_part_and_again_once_changed(tmp_path, monkeypatch):
    from attnkit.tasks import speech

    name = _recordings(tmp_path, "train.tsv", 10, 0)
    read = []

    def counted(path, sample_rate, n_mels):
        read.append(path.name)
        return transcribed_features(path, sample_rate, n_mels)

    monkeypatch.setattr(speech, "transcribed_features", counted)
    speech._transcribed.cache_clear()
    settings = ["model.arch=listen-attend-spell", f"data.dir={tmp_path}", f"data.train=[{name}]"]
    task = speech.SpeechTask(load_run_config(None, settings), None, echo=lambda message: None)
    assert read == ["train.tsv"] and (len(task.train), len(task.valid)) == (9, 1)
    path = tmp_path / name
    path.write_text(path.read_text(encoding="utf-8") + "clips/train.tsv-0.wav\tonce more\n", encoding="utf-8")
    assert len(split_utterances(load_run_config(None, settings), "train")) == 9 + 1  # 11, one held out
    assert read == ["train.tsv", "train.tsv"]


def test_the_training_loss_adds_the_guided_attention_loss_and_validation_does_not(tmp_path):
    from attnkit.models import build_model
    from attnkit.tasks.speech import SpeechTask

    name = _recordings(tmp_path, "train.tsv", 10, 0)
    settings = ["model.arch=listen-attend-spell", "model.preset=las-tiny", f"data.dir={tmp_path}",
                f"data.train=[{name}]", "model.guided_attention=2.5"]  # fmt: skip
    config = load_run_config(None, settings)
    task = SpeechTask(config, None, echo=lambda message: None)
    model = build_model(config.model, task.tokenizer.vocab_size)
    batch = task.make_batch(list(range(6)))
    guided, _ = task.loss(model.train(), batch)
    model(batch.frames, batch.tgt_in)
    penalty = model.attention_penalty(batch.tgt_out)  # las-tiny has no dropout: the same forward
    model.config.guided_attention = 0.0
    plain, _ = task.loss(model, batch)
    assert penalty > 0 and guided.item() == pytest.approx(plain.item() + penalty.item(), rel=1e-5)
    model.config.guided_attention = 2.5
    evaluated, _ = task.loss(model.eval(), batch)
    assert evaluated.item() == pytest.approx(plain.item(), rel=1e-5)
