"""Every config field with a closed set of values or a range is checked when the config is loaded, before
any data is read, with one line naming the file, the field, the value and what is allowed."""

import re

import pytest
from typer.testing import CliRunner

from attnkit.cli import app
from attnkit.config import RunConfig, load_run_config
from attnkit.errors import ConfigError

BAD_VALUES = [
    # (override, what the message must contain)
    (
        "train.eval_metric=blue",
        r"train\.eval_metric must be one of 'bleu', 'accuracy', 'f1', 'rouge1', 'rouge2', 'rougeL', "
        r"'cer', 'wer', 'loss'; got 'blue'",
    ),
    ("train.precision=fp16", r"train\.precision 'fp16' needs loss scaling.*use 'bf16'"),
    ("train.precision=half", r"train\.precision must be one of 'auto', 'fp32', 'bf16'; got 'half'"),
    ("train.update_freq=0", r"train\.update_freq must be >= 1; got 0"),
    ("train.max_tokens=0", r"train\.max_tokens must be >= 1; got 0"),
    ("train.eval_every=0", r"train\.eval_every must be >= 1; got 0"),
    ("train.keep_last=0", r"train\.keep_last must be >= 1; got 0"),
    ("train.schedule=linear", r"train\.schedule must be one of 'noam', 'inverse_sqrt', 'cosine', 'constant'"),
    ("train.weight_decay=-0.1", r"train\.weight_decay must be >= 0; got -0\.1"),
    ("data.task=text", r"data\.task='text' trains a model\.arch='decoder' model, not 'encoder-decoder'"),
    ("data.valid_fraction=1.0", r"data\.valid_fraction must be in \(0, 1\); got 1\.0"),
    ("decode.top_p=0", r"decode\.top_p must be in \(0, 1\]; got 0"),
    ("decode.temperature=-1", r"decode\.temperature must be >= 0; got -1"),
    ("decode.stop=['']", r"decode\.stop must be a list of non-empty strings"),
    ("train.warmup=0", r"train\.warmup must be >= 1; got 0"),  # noam divides by it
    ("train.lr=-1", r"train\.lr must be >= 0; got -1\.0"),
    ("train.lr=.nan", r"train\.lr must be >= 0; got nan"),
    ("train.max_steps=-5", r"train\.max_steps must be >= 0; got -5"),
    ("train.label_smoothing=1.0", r"train\.label_smoothing must be in \[0, 1\); got 1\.0"),
    ("train.layer_decay=1.5", r"train\.layer_decay must be in \(0, 1\]; got 1\.5"),
    ("train.layer_decay=0", r"train\.layer_decay must be > 0; got 0"),
    ("train.betas=[0.9]", r"train\.betas must be two numbers \[β1, β2\]; got \[0\.9\]"),
    ("train.betas=[0.9, 1.5]", r"train\.betas must be in \[0, 1\); got 1\.5"),
    ("train.eps=0", r"train\.eps must be > 0; got 0\.0"),
    ("train.device=gpu", r"train\.device must be 'auto' or a torch device .*; got 'gpu'"),
    ("decode.beam_size=0", r"decode\.beam_size must be >= 1; got 0"),
    ("decode.batch_size=0", r"decode\.batch_size must be >= 1; got 0"),
    ("decode.alpha=-0.5", r"decode\.alpha must be >= 0; got -0\.5"),
    ("decode.steps=fast", r"decode\.steps must be one of 'auto', 'compiled', 'eager'; got 'fast'"),
    (
        "decode.speculative=' '",  # (another word names a draft checkpoint, looked for as the model loads)
        r"decode\.speculative must be one of 'none', 'source', 'shallow' or a draft checkpoint's folder; "
        r"got ' '",
    ),
    ("decode.compile=maybe", r"'decode\.compile' must be true or false \(now decode\.steps\), got 'maybe'"),
    (
        "data.task=translate",
        r"data\.task must be one of 'parallel', 'dates', 'copy', 'summarise', 'text', 'classify', 'mlm', "
        r"'qa', 'cluttered-digits', 'captions', 'speech'; got 'translate'",
    ),
    (
        "data.tokenizer=sentencepiece",
        r"data\.tokenizer must be one of 'bpe', 'char', 'word'; got 'sentencepiece'",
    ),
    ("data.vocab_size=100", r"data\.vocab_size must be >= 260 for data\.tokenizer='bpe' .*; got 100"),
    ("data.max_len=1", r"data\.max_len must be >= 2; got 1"),
    (
        "data.train=[only_one.txt]",
        r"data\.train must list two files \[source, target\]; got \['only_one\.txt'\]",
    ),
    ("model.dropout=1.0", r"model\.dropout must be in \[0, 1\); got 1\.0"),
    ("model.positions=rotary", r"model\.positions must be one of 'sinusoidal', 'learned'; got 'rotary'"),
    ("model.layer_norm_eps=0", r"model\.layer_norm_eps must be > 0; got 0\.0"),
    ("train.batch_size=0", r"train\.batch_size must be >= 1; got 0"),
    ("data.canvas=10", r"data\.canvas must be >= 16; got 10"),
    ("data.clutter=-1", r"data\.clutter must be >= 0; got -1"),
]


@pytest.mark.parametrize(("override", "message"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_a_bad_value_is_one_line_naming_file_field_value_and_choices(tmp_path, override, message):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("train:\n  max_steps: 10\n", encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_run_config(recipe, [override])
    text = str(raised.value)
    assert text.startswith(f"{recipe} + overrides: ") and "\n" not in text
    assert re.search(message, text), text


def test_learned_positions_must_reach_the_longest_training_pair():
    with pytest.raises(ConfigError, match=r"model\.max_len \(64\) must be >= data\.max_len \(128\)"):
        load_run_config(None, ["model.positions=learned", "model.max_len=64", "data.max_len=128"])


def test_the_defaults_are_valid_and_the_presets_too():
    assert RunConfig().train.eval_metric == "bleu"
    for preset in ("paper-base", "paper-big", "small", "tiny"):
        load_run_config(None, [f"model.preset={preset}"])


@pytest.mark.parametrize("override", ["train.eval_metric=blue", "train.update_freq=0", "decode.beam_size=0"])
def test_the_cli_rejects_a_bad_value_before_reading_any_data(tmp_path, override):
    args = ["train", "--run-dir", str(tmp_path / "run"), "--data", str(tmp_path / "no_such_folder"),
            "data.train=[a.src, a.tgt]", "data.valid=[b.src, b.tgt]", "train.max_steps=5",
            override]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert override.split("=")[0] in result.stderr and "file not found" not in result.stderr
    assert not (tmp_path / "run").exists()  # nothing was started


def test_training_without_files_names_the_missing_setting(tmp_path):
    result = CliRunner().invoke(app, ["train", "--run-dir", str(tmp_path / "run"), "train.max_steps=5"])
    assert result.exit_code == 2
    assert "data.train is not set" in result.stderr


def test_hard_attentions_expected_share_is_a_fraction():
    with pytest.raises(ConfigError, match=r"model\.hard_expected must be in \[0, 1\); got 1\.0"):
        load_run_config(None, ["model.arch=rnn", "model.hard=true", "model.hard_expected=1.0"])


def test_decode_compile_the_old_name_of_decode_steps_still_reads():
    """Every run saved before ``decode.steps`` wrote ``compile: false``, the default then: such a run
    decodes with the new default (auto); ``compile: true`` is ``steps: compiled``; on the command line
    ``decode.compile=false`` asks for the model's own steps."""
    from attnkit.config import DecodeConfig, with_decode_overrides

    saved = {"decode": {"compile": False, "beam_size": 4}}
    assert RunConfig.from_dict(saved).decode.steps == "auto"
    assert RunConfig.from_dict({"decode": {"compile": True}}).decode.steps == "compiled"
    assert with_decode_overrides(DecodeConfig(), ["decode.compile=false"]).steps == "eager"
    assert with_decode_overrides(DecodeConfig(), ["decode.compile=true"]).steps == "compiled"
    assert "compile" not in RunConfig.from_dict(saved).to_dict()["decode"]
    with pytest.raises(ConfigError, match=r"decode\.compile is true or false"):
        with_decode_overrides(DecodeConfig(), ["decode.compile=auto"])
