"""End to end through the command line on a tiny file-based task: train, resume, translate, evaluate, average;
and user errors as one line with exit code 2."""

import json
import re

import pytest
from sacrebleu.metrics import BLEU
from typer.testing import CliRunner

from attnkit.cli import app
from tests.cli.checks import one_line_error

runner = CliRunner()
TINY = ["model.preset=tiny", "data.tokenizer=word", "train.max_tokens=300", "train.schedule=constant",
        "train.lr=0.003", "train.warmup=5", "train.eval_every=10", "decode.beam_size=2"]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory, copy_data):
    run = tmp_path_factory.mktemp("run")
    config = run / "recipe.yaml"
    config.write_text(
        "data:\n  train: [train.src, train.tgt]\n  valid: [valid.src, valid.tgt]\n", encoding="utf-8"
    )
    result = runner.invoke(app, ["train", str(config), "--run-dir", str(run), "--data", str(copy_data), *TINY,
                                 "--train.max_steps", "20"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert re.search(r"step 20 epoch \d+: train loss", result.output)
    return run


def test_training_writes_checkpoints_and_a_metrics_log(trained):
    assert (trained / "last").read_text(encoding="utf-8") == "step-0000020"
    assert (trained / "best").is_file()
    assert (
        len((trained / "metrics.csv").read_text(encoding="utf-8").splitlines()) == 3
    )  # header + steps 10 and 20


def test_resume_continues_from_the_last_checkpoint(trained):
    result = runner.invoke(app, ["train", "--resume", str(trained), "train.max_steps=30"])
    assert result.exit_code == 0, result.output
    assert "resumed from" in result.output and "at step 20" in result.output
    assert (trained / "last").read_text(encoding="utf-8") == "step-0000030"


def test_resuming_a_run_its_limits_already_end_says_so_instead_of_an_empty_validation(trained):
    last = (trained / "last").read_text(encoding="utf-8")
    at = int(last.split("-")[1])
    result = runner.invoke(app, ["train", "--resume", str(trained), f"train.max_steps={at}"])
    assert result.exit_code == 0, result.output
    assert f"nothing to train: the run is at step {at}" in result.output
    assert "final validation" not in result.output
    assert (trained / "last").read_text(encoding="utf-8") == last
    # a run that ended between two validations (its last one at the end): resumed, it adds no row
    ended = runner.invoke(app, ["train", "--resume", str(trained), f"train.max_steps={at + 3}"])
    assert ended.exit_code == 0, ended.output
    rows = (trained / "metrics.csv").read_text(encoding="utf-8")
    again = runner.invoke(app, ["train", "--resume", str(trained), f"train.max_steps={at + 3}"])
    assert "nothing to train" in again.output
    assert (trained / "metrics.csv").read_text(encoding="utf-8") == rows


def test_translate_reads_stdin_or_a_file_and_keeps_one_line_per_input(trained, copy_data, tmp_path):
    result = runner.invoke(app, ["translate", "--ckpt", str(trained), "--beam", "1"], input="1 2 3\n\n4 5\n")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 3 and result.stdout.splitlines()[1] == ""
    out = tmp_path / "out.txt"
    result = runner.invoke(
        app, ["translate", "--ckpt", str(trained), "-i", str(copy_data / "valid.src"), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert len(out.read_text(encoding="utf-8").splitlines()) == 20
    dashes = ["translate", "--ckpt", str(trained), "-i", "-", "-o", "-"]  # stdin and stdout, as usual
    result = runner.invoke(app, dashes, input=(copy_data / "valid.src").read_text(encoding="utf-8"))
    assert result.exit_code == 0, result.output
    assert result.stdout == out.read_text(encoding="utf-8") and not (tmp_path / "-").exists()


def test_evaluate_prints_sacrebleu_bleu_and_chrf_with_signatures(trained, copy_data):
    result = runner.invoke(app, ["evaluate", "--ckpt", str(trained), "--src", str(copy_data / "valid.src"),
                                 "--ref", str(copy_data / "valid.tgt")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert re.search(r"BLEU = \d+\.\d\d  \(nrefs:1\|.*version:", result.output)
    assert re.search(r"chrF = \d+\.\d\d  \(nrefs:1\|", result.output)
    files = ["--src", str(copy_data / "valid.src"), "--ref", str(copy_data / "valid.tgt")]
    one_stream = runner.invoke(app, ["evaluate", "--ckpt", str(trained), *files, "--streams", "1"])
    assert one_stream.exit_code == 0, one_stream.output
    assert one_stream.output.splitlines()[:2] == result.output.splitlines()[:2]  # the same scores


def test_average_writes_a_loadable_checkpoint(trained):
    result = runner.invoke(app, ["average", "--run-dir", str(trained), "--last", "2"])
    assert result.exit_code == 0, result.output
    assert "averaged 2 checkpoints" in result.output
    result = runner.invoke(app, ["translate", "--ckpt", str(trained / "averaged")], input="1 2\n")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["data.train=[missing.src, train.tgt]"], r"missing\.src: file not found"),
        (["train.lrr=1"], r"unknown field 'train\.lrr'"),
        (["data.train=[train.src, valid.tgt]"], r"train\.src has 300 lines but .*valid\.tgt has 20"),
        (["model.h=5"], r"divisible by model\.h"),
        (["oops"], r"unexpected argument 'oops'"),
    ],
)
def test_bad_input_is_one_line_naming_the_problem(copy_data, tmp_path, extra, message):
    args = ["train", "--run-dir", str(tmp_path / "r"), "--data", str(copy_data), *TINY, "train.max_steps=1",
            "data.train=[train.src, train.tgt]", "data.valid=[valid.src, valid.tgt]", *extra]  # fmt: skip
    result = runner.invoke(app, args)
    one_line_error(result, message)


def test_yaml_floats_without_a_dot_are_numbers(tmp_path):
    from attnkit.config import load_run_config

    (tmp_path / "r.yaml").write_text("train:\n  lr: 5e-4\n  label_smoothing: 1e-1\n", encoding="utf-8")
    config = load_run_config(tmp_path / "r.yaml")
    assert config.train.lr == 5e-4 and config.train.label_smoothing == 0.1


def test_decode_settings_change_for_translate_and_evaluate_without_retraining(trained, copy_data):
    """``decode.max_len_a=0 decode.max_len_b=1`` leaves room for ``</s>`` alone (the bound counts it):
    every translation is empty and BLEU is 0, where the run's own settings translate the copy task."""
    src, ref = str(copy_data / "valid.src"), str(copy_data / "valid.tgt")
    run_settings = runner.invoke(app, ["translate", "--ckpt", str(trained), "-i", src])
    bounded = runner.invoke(app, ["translate", "--ckpt", str(trained), "-i", src, "decode.max_len_a=0",
                                  "decode.max_len_b=1"])  # fmt: skip
    assert run_settings.exit_code == bounded.exit_code == 0, bounded.output
    assert any(run_settings.stdout.splitlines()) and bounded.stdout == "\n" * 20
    spelled = runner.invoke(app, ["translate", "--ckpt", str(trained), "-i", src, "--decode.max_len_a", "0",
                                  "--decode.max_len_b", "1"])  # fmt: skip
    assert spelled.exit_code == 0 and spelled.stdout == bounded.stdout
    scored = runner.invoke(app, ["evaluate", "--ckpt", str(trained), "--src", src, "--ref", ref,
                                 "decode.max_len_a=0", "decode.max_len_b=1"])  # fmt: skip
    assert scored.exit_code == 0 and scored.stdout.startswith("BLEU = 0.00"), scored.output
    checkpoint = trained / (trained / "best").read_text(encoding="utf-8").strip()
    assert (
        json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))["decode"]["max_len_b"] == 10
    )  # untouched


def test_greedy_translation_with_source_drafts_gives_greedy_translations(trained, copy_data):
    """The copy task copies its source, so drafts from it are taken: the same lines as plain greedy
    search, and with scores (``--n-best 1``) a beam of one's lines and scores; a wider beam takes no
    drafts and says so in one line."""
    src = str(copy_data / "valid.src")
    for scored in ([], ["--n-best", "1"]):
        plain = runner.invoke(app, ["translate", "--ckpt", str(trained), "-i", src, "--beam", "1", *scored])
        drafted = runner.invoke(app, ["translate", "--ckpt", str(trained), "-i", src, "--beam", "1", *scored,
                                      "decode.speculative=source"])  # fmt: skip
        assert plain.exit_code == drafted.exit_code == 0, drafted.output
        assert drafted.stdout == plain.stdout and any(plain.stdout.splitlines())
        assert " ||| " in plain.stdout or not scored
    beam = runner.invoke(app, ["translate", "--ckpt", str(trained), "-i", src, "decode.speculative=source"])
    assert beam.exit_code == 0, beam.output
    assert "decode.speculative=source checks drafts in a search of one beam alone" in beam.stderr
    assert "(beam 2) takes none" in beam.stderr
    # (with compiled steps: tests/decode/test_speculative_compiled.py, in the slow set)


def test_translate_writes_n_best_lists_with_the_line_of_each(trained, tmp_path, monkeypatch):
    """``--n-best 2``: 'LINE ||| TRANSLATION ||| SCORE' lines, LINE from 0 across the parts the input is
    read in, best first, the first the translation itself; none for an empty line."""
    source = tmp_path / "in.txt"
    source.write_text("1 2 3\n\n4 5\n2 2 1\n", encoding="utf-8")
    monkeypatch.setattr("attnkit.cli.decoding.PART_LINES", 3)
    result = runner.invoke(app, ["translate", "--ckpt", str(trained), "-i", str(source), "--n-best", "2"])
    assert result.exit_code == 0, result.output
    rows = [line.split(" ||| ") for line in result.stdout.splitlines()]
    assert [int(row[0]) for row in rows] == [0, 0, 2, 2, 3, 3]
    assert all(float(a[2]) >= float(b[2]) for a, b in zip(rows[::2], rows[1::2], strict=True))
    best = runner.invoke(app, ["translate", "--ckpt", str(trained), "-i", str(source)])
    assert [row[1] for row in rows[::2]] == [best.stdout.splitlines()[i] for i in (0, 2, 3)]
    refused = runner.invoke(app, ["translate", "--ckpt", str(trained), "--n-best", "3"], input="1 2\n")
    assert refused.exit_code == 2, refused.output
    assert "--n-best 3 needs a beam at least as wide: give --beam 3" in refused.stderr


@pytest.mark.parametrize("flags", [["--int8"], ["--precision", "int8"], ["--precision", "bf16"]])
def test_translate_in_int8_or_bf16_translates_alike(trained, copy_data, tmp_path, flags):
    """--int8 (--precision int8: int8 linear maps) and --precision bf16 against --precision fp32."""
    outputs = {}
    for name, given in (("fp32", ["--precision", "fp32"]), ("other", flags)):
        out = tmp_path / f"{name}.txt"
        result = runner.invoke(app, ["translate", "--ckpt", str(trained), "-i", str(copy_data / "valid.src"),
                                     "-o", str(out), "--beam", "1", *given])  # fmt: skip
        assert result.exit_code == 0, result.output
        outputs[name] = out.read_text(encoding="utf-8").splitlines()
    same = sum(a == b for a, b in zip(outputs["fp32"], outputs["other"], strict=True))
    print(f"{' '.join(flags)} and float32 agree on {same} of 20 lines")
    assert len(outputs["other"]) == 20 and same >= 14
    result = runner.invoke(app, ["translate", "--ckpt", str(trained), "--engine", "ctranslate2", *flags])
    refused = r"is attnkit's; CTranslate2 takes .* export.*--quantization"
    assert result.exit_code == 2 and re.search(refused, result.stderr), result.output
    scored = runner.invoke(app, ["evaluate", "--ckpt", str(trained), "--src", str(copy_data / "valid.src"),
                                 "--ref", str(copy_data / "valid.tgt"), "--beam", "1", *flags])  # fmt: skip
    assert scored.exit_code == 0, scored.output
    expected = BLEU().corpus_score(
        outputs["other"], [(copy_data / "valid.tgt").read_text(encoding="utf-8").splitlines()]
    )
    assert scored.stdout.startswith(f"BLEU = {expected.score:.2f}")  # the int8 or bf16 translations' score


def test_int8_and_another_precision_together_are_one_line(trained):
    result = runner.invoke(app, ["translate", "--ckpt", str(trained), "--int8", "--precision", "bf16"])
    assert result.exit_code == 2 and "--int8 means --precision int8" in result.stderr


def test_translate_streams_translate_as_one_batch_at_a_time(trained, copy_data, tmp_path):
    """``--streams 2`` (batches side by side, each on one thread) gives the lines ``--streams 1`` gives."""
    outputs = {}
    for streams in ("1", "2"):
        out = tmp_path / f"out{streams}.txt"
        result = runner.invoke(app, ["translate", "--ckpt", str(trained), "-i", str(copy_data / "valid.src"),
                                     "-o", str(out), "--streams", streams])  # fmt: skip
        assert result.exit_code == 0, result.output
        outputs[streams] = out.read_text(encoding="utf-8").splitlines()
    assert outputs["2"] == outputs["1"] and len(outputs["1"]) == 20
    result = runner.invoke(app, ["translate", "--ckpt", str(trained), "--streams", "-1"], input="1 2\n")
    assert result.exit_code == 2 and "--streams must be at least 0" in result.output


def test_a_distilled_draft_decoder_gives_greedy_translations_in_fewer_steps(trained, copy_data):
    """``distill-draft`` teaches the run's draft decoder from its training sources and saves it in the
    checkpoint; greedy translation with it gives plain greedy search's lines. Without one, asking for
    it is a one-line error naming the command that makes one."""
    src = str(copy_data / "valid.src")
    shallow = ["translate", "--ckpt", str(trained), "-i", src, "--beam", "1", "decode.speculative=shallow"]
    checkpoint = trained / (trained / "best").read_text(encoding="utf-8").strip()
    one_line_error(runner.invoke(app, shallow), r"has no draft decoder .* attnkit distill-draft --ckpt")
    sampling = ["distill-draft", "--ckpt", str(trained), "--minutes", "0.05", "--temperature", "0.8"]
    one_line_error(runner.invoke(app, sampling), r"--temperature: drafts for sampling are a GPT's")
    made = runner.invoke(app, ["distill-draft", "--ckpt", str(trained), "--minutes", "0.05"])
    assert made.exit_code == 0, made.output
    found = re.search(
        r"guesses ([\d.]+)% .* held-out tokens \(a copy of its first layer: ([\d.]+)%\)", made.stdout
    )
    assert found and float(found[1]) > float(found[2]), made.stdout
    assert (checkpoint / "draft.safetensors").is_file()
    plain = runner.invoke(app, ["translate", "--ckpt", str(trained), "-i", src, "--beam", "1"])
    drafted = runner.invoke(app, shallow)
    assert plain.exit_code == drafted.exit_code == 0, drafted.output
    assert drafted.stdout == plain.stdout and any(plain.stdout.splitlines())


def test_a_smaller_model_of_another_checkpoint_drafts_for_greedy_translation(trained, copy_data, tmp_path):
    """``decode.speculative=PATH``: a model with one encoder and one decoder layer, trained on the same
    data (the same vocabulary), drafts over its own encoding of each source; greedy translation gives
    plain greedy search's lines. A draft where there is no checkpoint is a one-line error."""
    draft = tmp_path / "draft"
    config = tmp_path / "recipe.yaml"
    config.write_text(
        "data:\n  train: [train.src, train.tgt]\n  valid: [valid.src, valid.tgt]\n", encoding="utf-8"
    )
    small = ["model.encoder_layers=1", "model.decoder_layers=1", "train.max_steps=20"]
    result = runner.invoke(app, ["train", str(config), "--run-dir", str(draft), "--data", str(copy_data),
                                 *TINY, *small])  # fmt: skip
    assert result.exit_code == 0, result.output
    src = str(copy_data / "valid.src")
    greedy = ["translate", "--ckpt", str(trained), "-i", src, "--beam", "1"]
    plain = runner.invoke(app, greedy)
    for batch in ("1", "8"):
        drafted = runner.invoke(app, [*greedy, f"decode.speculative={draft}", f"decode.batch_size={batch}"])
        assert plain.exit_code == drafted.exit_code == 0, drafted.output
        assert drafted.stdout == plain.stdout and any(plain.stdout.splitlines()), batch
    one_line_error(
        runner.invoke(app, [*greedy, f"decode.speculative={trained}-nowhere"]), r"no checkpoint here"
    )


def test_a_run_asking_for_drafts_validates_without_them(copy_data, tmp_path):
    """``decode.speculative=shallow`` in a training recipe: validation decodes without drafts (the
    model has no draft decoder yet: one is distilled from the trained model)."""
    config = tmp_path / "recipe.yaml"
    config.write_text(
        "data:\n  train: [train.src, train.tgt]\n  valid: [valid.src, valid.tgt]\n", encoding="utf-8"
    )
    run = str(tmp_path / "run")
    result = runner.invoke(app, ["train", str(config), "--run-dir", run, "--data", str(copy_data), *TINY,
                                 "--train.max_steps", "10", "decode.speculative=shallow"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert re.search(r"step 10 epoch \d+: .*bleu", result.output), result.output
