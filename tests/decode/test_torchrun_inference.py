"""Inference under torchrun: two processes (gloo, CPU) each translate or continue their share of the
input, and the first writes one output in input order, byte for byte what one process writes."""

import subprocess
import sys

import pytest
import torch

from attnkit.config import load_run_config
from attnkit.train.loop import Trainer

pytestmark = [
    pytest.mark.slow,  # several processes each (the slow set)
    pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed"),
]

TWO = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "attnkit"]
ONE = [sys.executable, "-m", "attnkit"]


def _run(launcher, *arguments):
    result = subprocess.run([*launcher, *arguments], capture_output=True, timeout=300, check=False,
                            encoding="utf-8")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def runs(copy_data, tmp_path_factory):
    """A tiny translator trained on the copy task, and a tiny character-level GPT on the same digits."""
    folder = tmp_path_factory.mktemp("torchrun_inference")
    common = ["train.schedule=constant", "train.warmup=0", "train.lr=3e-3", "train.max_tokens=512",
              "train.max_steps=40", "train.eval_every=40", f"data.dir={copy_data}"]  # fmt: skip
    translator = [*common, "model.preset=tiny", "data.train=[train.src, train.tgt]",
                  "data.valid=[valid.src, valid.tgt]", "data.tokenizer=word"]  # fmt: skip
    Trainer(load_run_config(None, translator), folder / "translator", echo=lambda m: None).fit()
    gpt = [*common, "model.preset=tiny-decoder", "data.train=[train.src]", "data.tokenizer=char"]
    Trainer(load_run_config(None, gpt), folder / "gpt", echo=lambda m: None).fit()
    for name, first, n in (("train.tsv", 0, 200), ("dev.tsv", 500, 20)):  # "odd" when the first digit is
        rows = [
            f"{k % 9 + 1} {k % 7}\t{'odd' if (k % 9 + 1) % 2 else 'even'}" for k in range(first, first + n)
        ]
        (folder / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    classifier = [*common[:-1], f"data.dir={folder}", "model.arch=encoder", "model.preset=tiny-encoder",
                  "model.head=classify", "data.task=classify", "data.train=[train.tsv]",
                  "data.valid=[dev.tsv]", "data.tokenizer=word"]  # fmt: skip
    Trainer(load_run_config(None, classifier), folder / "classifier", echo=lambda m: None).fit()
    return folder


def test_two_processes_translate_as_one_with_n_best_numbering(runs, copy_data, tmp_path):
    source = tmp_path / "source.txt"
    lines = (copy_data / "valid.src").read_text(encoding="utf-8").splitlines()[:6]
    source.write_text("\n".join([*lines[:3], "", *lines[3:]]) + "\n", encoding="utf-8")  # 7 lines, one empty
    for options in (["--beam", "2"], ["--beam", "3", "--n-best", "2"]):
        outputs = {}
        for name, launcher in (("one", ONE), ("two", TWO)):
            out = tmp_path / f"{name}.txt"
            _run(launcher, "translate", "--ckpt", str(runs / "translator"), "-i", str(source), "-o", str(out),
                 *options)  # fmt: skip
            outputs[name] = out.read_text(encoding="utf-8")
        assert outputs["two"] == outputs["one"], options
    n_best = outputs["one"].splitlines()
    numbers = [str(i) for i in (0, 1, 2, 4, 5, 6) for _ in range(2)]  # line 3, empty, has no translation
    assert [line.split(" ||| ")[0] for line in n_best] == numbers  # numbered over the whole input


def test_two_processes_sample_continuations_as_one(runs, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"{d} {d}\n" for d in "1234567"), encoding="utf-8")
    options = ["--max-new-tokens", "8", "--temperature", "0.9", "--seed", "5"]
    one = _run(ONE, "generate", "--ckpt", str(runs / "gpt"), "-i", str(prompts), *options).stdout
    two = _run(TWO, "generate", "--ckpt", str(runs / "gpt"), "-i", str(prompts), *options).stdout
    assert two == one and len(one.splitlines()) == 7  # stdout: the first process alone writes
    assert len(set(one.splitlines())) > 1


def test_two_processes_classify_as_one(runs, tmp_path):
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("".join(f"{k % 9 + 1} {k % 5}\n" for k in range(9)), encoding="utf-8")
    arguments = ["predict", "--ckpt", str(runs / "classifier"), "-i", str(sentences)]
    one, two = _run(ONE, *arguments).stdout, _run(TWO, *arguments).stdout
    assert two == one and len(one.splitlines()) == 9
    assert all(line.split("\t")[0] in ("odd", "even") for line in one.splitlines())


def test_under_torchrun_the_input_must_be_a_file(runs):
    result = subprocess.run([*TWO, "translate", "--ckpt", str(runs / "translator")], input="1 2\n",
                            capture_output=True, timeout=300, check=False, encoding="utf-8")  # fmt: skip
    assert result.returncode != 0
    assert "under torchrun every process reads the input: give it as -i FILE" in result.stderr
