"""Every command, every kind of bad input: corrupt or mismatched checkpoints, values out of range,
outputs that cannot be written, pathological sizes and empty input each end in one clear line (or, for
empty input, in empty output), never a traceback, a stall or a silently wrong result."""

import json
import re
import shutil
import subprocess
import sys
from typing import ClassVar

import pytest
import torch
from sacrebleu.metrics import BLEU
from typer.testing import CliRunner

from attnkit.cli import app
from tests.cli.checks import one_line_error

runner = CliRunner()


@pytest.fixture(scope="module")
def run(tmp_path_factory, copy_data):
    folder = tmp_path_factory.mktemp("run")
    result = runner.invoke(app, [
        "train", "--run-dir", str(folder), "--data", str(copy_data), "model.preset=tiny", "model.max_len=32",
        "data.max_len=16", "data.tokenizer=word", "data.train=[train.src, train.tgt]",
        "data.valid=[valid.src, valid.tgt]", "train.max_tokens=300", "train.schedule=constant",
        "train.lr=0.003", "train.warmup=5", "train.max_steps=20", "train.eval_every=10",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return folder


def _checkpoint_copy(run, tmp_path):
    source = run / (run / "last").read_text(encoding="utf-8").strip()
    return shutil.copytree(source, tmp_path / "ckpt")


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _edit_config(path, **model):
    values = json.loads(path.read_text(encoding="utf-8"))
    values["model"].update(model)
    path.write_text(json.dumps(values), encoding="utf-8")


def _other_tokenizer(checkpoint):
    from attnkit.data.tokenizer import Tokenizer

    (checkpoint / "tokenizer.json").write_text(
        Tokenizer.train("word", ["a b c d e f g h"]).to_str(), encoding="utf-8"
    )


SHAPES_DISAGREE = r"model\.safetensors: '[\w.]+' has shape \(\d+, \d+\) but config\.json and tokenizer\.json"
CORRUPTIONS = {  # what is done to a copy of a checkpoint -> what the one-line error must say
    "truncated weights": (
        lambda c: _truncate(c / "model.safetensors"),
        r"model\.safetensors: corrupt or truncated",
    ),
    "config not JSON": (
        lambda c: (c / "config.json").write_text("{oops", encoding="utf-8"),
        r"config\.json: not readable JSON",
    ),
    "config with an unknown field": (
        lambda c: _edit_config(c / "config.json", colour="red"),
        r"config\.json: unknown field 'model\.colour'",
    ),
    "config of another model size": (
        lambda c: _edit_config(c / "config.json", d_model=64, h=4),
        SHAPES_DISAGREE,
    ),
    "tokenizer missing": (
        lambda c: (c / "tokenizer.json").unlink(),
        r"tokenizer\.json: file not found",
    ),
    "tokenizer of another vocabulary": (_other_tokenizer, SHAPES_DISAGREE),
    "padding ids disagree": (
        lambda c: _edit_config(c / "config.json", pad_id=3),
        r"model\.pad_id=3 but tokenizer\.json's <pad> is 0",
    ),
    "weights missing": (
        lambda c: (c / "model.safetensors").unlink(),
        r"no checkpoint here",
    ),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupt_or_mismatched_checkpoint_is_one_line_naming_the_file(run, tmp_path, corruption):
    checkpoint = _checkpoint_copy(run, tmp_path)
    corrupt, message = CORRUPTIONS[corruption]
    corrupt(checkpoint)
    one_line_error(runner.invoke(app, ["translate", "--ckpt", str(checkpoint)], input="1 2\n"), message)


def test_resuming_from_a_truncated_trainer_state_is_one_line(run, tmp_path):
    copy_of_run = shutil.copytree(run, tmp_path / "run")
    _truncate(
        copy_of_run / (copy_of_run / "last").read_text(encoding="utf-8").strip() / "trainer_state.safetensors"
    )
    result = runner.invoke(app, ["train", "--resume", str(copy_of_run), "train.max_steps=30"])
    one_line_error(result, r"trainer_state\.safetensors: corrupt or truncated")


def test_a_last_pointer_naming_a_deleted_checkpoint_is_one_line(run, tmp_path):
    copy_of_run = shutil.copytree(run, tmp_path / "run")
    for folder in copy_of_run.glob("step-*"):
        shutil.rmtree(folder)
    result = runner.invoke(app, ["translate", "--ckpt", str(copy_of_run)], input="1\n")
    one_line_error(result, r"'last' names 'step-0000020', which is gone")


@pytest.mark.parametrize(
    ("to", "message"),
    [
        ("hf", r"an HF transformers model folder \(model_type 'marian'\), not an attnkit checkpoint; make it "
               r"one with attnkit import-hf \S+ --out RUN_DIR"),
        ("ctranslate2", r"a CTranslate2 model folder, not an attnkit checkpoint; translate with it by "
                        r"attnkit translate --engine ctranslate2 --ckpt \S+"),
    ],
)  # fmt: skip
def test_an_exported_folder_given_as_a_checkpoint_names_the_command_that_reads_it(run, tmp_path, to, message):
    if to == "ctranslate2":
        pytest.importorskip("ctranslate2", reason="CTranslate2 writes the folder")
    exported = tmp_path / to
    export = runner.invoke(app, ["export", "--ckpt", str(run), "--to", to, "--out", str(exported)])
    assert export.exit_code == 0, export.output
    one_line_error(runner.invoke(app, ["translate", "--ckpt", str(exported)], input="1 2\n"), message)
    evaluate = ["evaluate", "--ckpt", str(exported), "--src", str(exported), "--ref", str(exported)]
    one_line_error(runner.invoke(app, evaluate), message)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["translate", "--beam", "0"], r"--beam must be at least 1; got 0"),
        (["evaluate", "--beam", "-2", "--src", "x", "--ref", "y"], r"--beam must be at least 1; got -2"),
        (["average", "--last", "0"], r"--last must be at least 1; got 0"),
    ],
)
def test_option_values_out_of_range_are_one_line(run, args, message):
    flag = "--run-dir" if args[0] == "average" else "--ckpt"
    one_line_error(runner.invoke(app, [*args, flag, str(run)], input="1\n"), message)


@pytest.mark.parametrize(
    ("command", "setting", "message"),
    [
        ("translate", "decode.alpha=-1", r"decode\.alpha must be >= 0; got -1"),
        ("translate", "decode.length_penalty=wu", r"decode\.length_penalty must be one of"),
        ("translate", "decode.nope=1", r"unknown field 'decode\.nope'; known: \['alpha'"),
        ("translate", "model.d_model=8", r"'model' settings are fixed by training; only decode\.\* ones can"),
        ("translate", "stray", r"unexpected argument 'stray'; config overrides look like decode\.alpha=0\.6"),
        ("evaluate", "decode.max_len_b=-1", r"decode\.max_len_b must be >= 0; got -1"),
    ],
)
def test_decode_settings_on_the_command_line_are_checked_before_any_work(run, command, setting, message):
    files = ["--src", "x", "--ref", "y"] if command == "evaluate" else []  # not read: the check comes first
    result = runner.invoke(app, [command, "--ckpt", str(run), *files, setting], input="1 2\n")
    one_line_error(result, message)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["summary", "--vocab", "0"], r"--vocab must be at least 5; got 0"),
        (["summary", "--length", "0"], r"--length must be at least 1; got 0"),
        (["quickstart", "--steps", "0"], r"--steps must be at least 1; got 0"),
    ],
)
def test_other_commands_check_their_options_too(args, message):
    one_line_error(runner.invoke(app, args), message)


@pytest.mark.parametrize("where", ["missing folder", "a folder"])
def test_an_output_that_cannot_be_written_fails_before_translating(run, tmp_path, monkeypatch, where):
    out = tmp_path / "no_such_folder" / "out.txt" if where == "missing folder" else tmp_path
    monkeypatch.setattr("attnkit.decode.translate.translate", lambda *a, **k: pytest.fail("translated first"))
    result = runner.invoke(app, ["translate", "--ckpt", str(run), "-o", str(out)], input="1 2\n")
    one_line_error(result, r"does not exist" if where == "missing folder" else r"is a folder")


def test_empty_input_gives_empty_output(run, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    out = tmp_path / "out.txt"
    result = runner.invoke(app, ["translate", "--ckpt", str(run), "-i", str(empty), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8") == ""
    result = runner.invoke(app, ["translate", "--ckpt", str(run)], input="")
    assert result.exit_code == 0 and result.stdout == ""
    result = runner.invoke(app, ["translate", "--ckpt", str(run)], input="\n \n")
    assert result.exit_code == 0 and result.stdout == "\n\n"


def test_one_very_long_line_is_cut_to_the_model_and_said_once(run):
    long_line = " ".join(["1 2 3 4 5"] * 40)  # 200 tokens; the model has 32 positions
    result = runner.invoke(app, ["translate", "--ckpt", str(run), "--beam", "2"],
                           input=f"{long_line}\n1 2\n{long_line}\n")  # fmt: skip
    assert result.exit_code == 0, result.output
    notes = result.stderr.strip().splitlines()
    assert len(notes) == 1 and "2 input line(s) have more tokens than the model's 32 positions" in notes[0]
    outputs = result.stdout.splitlines()
    assert len(outputs) == 3 and all(len(line.split()) <= 32 for line in outputs)


class CountingBar:
    """Stands in for tqdm's progress bar (which shows on a terminal only), counting the lines it hears of."""

    counted: ClassVar[list[int]] = []

    def __init__(self, total=None, **options):
        self.counted.append(0)

    def __enter__(self):
        return self

    def __exit__(self, *error):
        return False

    def update(self, lines):
        self.counted[-1] += lines

    @classmethod
    def install(cls, monkeypatch) -> list[int]:
        """Use it for the rest of the test; returns the count of each bar made, in order."""
        monkeypatch.setattr(cls, "counted", [])
        monkeypatch.setattr("tqdm.tqdm", cls)
        return cls.counted


def test_invalid_utf8_on_stdin_or_in_a_file_is_one_line_naming_the_line(run, tmp_path):
    result = runner.invoke(app, ["translate", "--ckpt", str(run)], input=b"1 2\n3 \xff 4\n")
    one_line_error(result, r"<stdin>:2: invalid UTF-8 at byte 2 of the line")
    (tmp_path / "in.txt").write_bytes(b"1 2\n\n5 \xfe\n")
    result = runner.invoke(app, ["translate", "--ckpt", str(run), "-i", str(tmp_path / "in.txt")])
    one_line_error(result, r"in\.txt:3: invalid UTF-8 at byte 2 of the line")


def test_a_large_input_is_translated_a_part_at_a_time_as_it_would_be_whole(run, tmp_path, monkeypatch):
    """Three lines a part: the same lines out as in one part, the note about a line too long names its
    line in the whole input, and the progress counts every line once."""
    long_line = " ".join(["1 2 3 4 5"] * 40)  # 200 tokens; the model has 32 positions
    lines = ["1 2 3", "", "4 5", "2 2 1", "3", long_line, "5 4 3 2", ""]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    whole = runner.invoke(app, ["translate", "--ckpt", str(run), "-i", str(tmp_path / "in.txt")])
    counted = CountingBar.install(monkeypatch)
    monkeypatch.setattr("attnkit.cli.decoding.PART_LINES", 3)
    out = tmp_path / "out.txt"
    parts = runner.invoke(
        app, ["translate", "--ckpt", str(run), "-i", str(tmp_path / "in.txt"), "-o", str(out)]
    )
    assert whole.exit_code == parts.exit_code == 0, parts.output
    assert out.read_text(encoding="utf-8") == whole.stdout and len(whole.stdout.splitlines()) == len(lines)
    assert "(line 6: 200 tokens)" in parts.stderr and counted == [len(lines)]


def test_a_failure_halfway_leaves_the_output_file_as_it_was(run, tmp_path, monkeypatch):
    (tmp_path / "in.txt").write_bytes(b"1 2\n3 4\n5 \xff\n")
    out = tmp_path / "out.txt"
    out.write_text("an earlier translation\n", encoding="utf-8")
    monkeypatch.setattr(
        "attnkit.cli.decoding.PART_LINES", 2
    )  # the first part is translated, the second fails
    result = runner.invoke(
        app, ["translate", "--ckpt", str(run), "-i", str(tmp_path / "in.txt"), "-o", str(out)]
    )
    one_line_error(result, r"in\.txt:3: invalid UTF-8")
    assert out.read_text(encoding="utf-8") == "an earlier translation\n" and sorted(tmp_path.iterdir()) == [
        tmp_path / "in.txt",
        out,
    ]


def test_evaluate_counts_its_progress_in_lines(run, tmp_path, monkeypatch):
    (tmp_path / "src").write_text("1 2 3\n\n4 5\n", encoding="utf-8")
    (tmp_path / "ref").write_text("1 2 3\n\n4 5\n", encoding="utf-8")
    counted = CountingBar.install(monkeypatch)
    files = ["--src", str(tmp_path / "src"), "--ref", str(tmp_path / "ref")]
    assert runner.invoke(app, ["evaluate", "--ckpt", str(run), *files]).exit_code == 0
    assert counted == [3]


def test_evaluate_scores_every_pair_and_counts_the_empty_ones(run, tmp_path):
    (tmp_path / "src").write_text("1 2 3\n\n4 5\n2 2\n", encoding="utf-8")
    (tmp_path / "ref").write_text("1 2 3\n3 3\n\n2 2\n", encoding="utf-8")
    result = runner.invoke(app, ["evaluate", "--ckpt", str(run), "--src", str(tmp_path / "src"),
                                 "--ref", str(tmp_path / "ref"), "--beam", "1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "4 sentences" in result.stdout
    assert (
        "1 with an empty source (scored as an empty translation), 1 with an empty reference" in result.stdout
    )
    hypotheses = runner.invoke(app, ["translate", "--ckpt", str(run), "--beam", "1", "-i",
                                     str(tmp_path / "src")]).stdout.split("\n")[:4]  # fmt: skip
    assert hypotheses[1] == ""
    expected = BLEU().corpus_score(hypotheses, [["1 2 3", "3 3", "", "2 2"]]).score
    assert f"BLEU = {expected:.2f}" in result.stdout


def test_average_refuses_what_cannot_work(run, tmp_path):
    result = runner.invoke(app, ["average", "--run-dir", str(tmp_path / "nothing")])
    one_line_error(result, r"nothing: no such run directory")
    (tmp_path / "empty_run").mkdir()
    one_line_error(runner.invoke(app, ["average", "--run-dir", str(tmp_path / "empty_run")]),
                    r"no checkpoints to average")  # fmt: skip
    last = run / (run / "last").read_text(encoding="utf-8").strip()
    result = runner.invoke(app, ["average", "--run-dir", str(run), "--out", str(last)])
    one_line_error(result, rf"{last.name} is a checkpoint it would be made from; name another folder")


def test_export_and_average_never_delete_a_run_or_the_checkpoint_they_read(run, tmp_path):
    copy_of_run = shutil.copytree(run, tmp_path / "run")
    before = sorted(p.name for p in copy_of_run.iterdir())
    for command in (
        ["export", "--ckpt", str(copy_of_run), "--to", "hf", "--out", str(copy_of_run)],
        ["average", "--run-dir", str(copy_of_run), "--last", "1", "--out", str(copy_of_run)],
    ):
        one_line_error(
            runner.invoke(app, command), r"run holds step-\d+, which is a checkpoint it would be made from"
        )
    assert sorted(p.name for p in copy_of_run.iterdir()) == before
    averaged = copy_of_run / "averaged"
    assert runner.invoke(app, ["average", "--run-dir", str(copy_of_run), "--last", "1"]).exit_code == 0
    result = runner.invoke(app, ["export", "--ckpt", str(averaged), "--to", "hf", "--out", str(averaged)])
    one_line_error(result, r"averaged is a checkpoint it would be made from")
    assert (averaged / "model.safetensors").is_file() and not (averaged / "generation_config.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_asking_for_a_gpu_that_is_not_there_is_one_line(copy_data, tmp_path):
    result = runner.invoke(app, ["train", "--run-dir", str(tmp_path / "r"), "--data", str(copy_data),
                                 "data.train=[train.src, train.tgt]", "data.valid=[valid.src, valid.tgt]",
                                 "train.max_steps=1", "train.device=cuda"])  # fmt: skip
    one_line_error(result, r"train\.device='cuda', but this torch sees no CUDA device")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["translate"],
            r"^attnkit: error: Missing option '--ckpt'\. \(try '(python -m )?attnkit translate --help'\)$",
        ),
        (["summary", "--vocab", "many"], r"^attnkit: error: Invalid value for '--vocab'"),
        (["transalte"], r"^attnkit: error: No such command 'transalte'"),
    ],
)
def test_usage_errors_of_the_installed_program_are_one_line_too(args, message):
    result = subprocess.run([sys.executable, "-m", "attnkit", *args], capture_output=True, text=True,
                            timeout=60, check=False, encoding="utf-8")  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), result.stderr
