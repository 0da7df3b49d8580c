"""attnkit under the C locale (a minimal container, a cron job), where Python's default for files,
stdin and stdout is ASCII: training on German text, resuming it, translating it and looking at its
attention read and write UTF-8 all the same. Each command runs in a subprocess with ``LC_ALL=C``,
``PYTHONUTF8=0`` and ``PYTHONCOERCECLOCALE=0``, so that Python keeps the ASCII defaults."""

import codecs
import json
import os
import subprocess
import sys

import pytest

from attnkit.data.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # each command in a fresh process (the slow set)

C_LOCALE = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
            "PYTHONIOENCODING": ""}  # fmt: skip
SOURCE = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau trägt einen Hut.",
          "Kinder laufen über die Straße.", "Das Mädchen isst ein Brötchen."]  # fmt: skip
TARGET = ["A man rides a bike.", "Two dogs play in the snow.", "A woman wears a hat.",
          "Children run across the street.", "The girl eats a bun."]  # fmt: skip


def attnkit(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """``python -m attnkit ARGS`` under the C locale; its output read as the UTF-8 bytes it must be."""
    return subprocess.run(
        [sys.executable, "-m", "attnkit", *args], input=stdin.encode("utf-8"), capture_output=True,
        env=C_LOCALE, timeout=300, check=False,
    )  # fmt: skip


def test_python_really_runs_with_ascii_defaults_here():
    """The premise: without attnkit's care, this Python would write files and stdout as ASCII."""
    probe = "import locale, sys; print(locale.getpreferredencoding(False), sys.stdout.encoding)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, env=C_LOCALE, check=True)
    assert [codecs.lookup(name).name for name in result.stdout.decode().split()] == ["ascii", "ascii"]


def test_train_resume_translate_and_explore_non_ascii_text_under_the_c_locale(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name, lines in (("train.de", SOURCE * 20), ("train.en", TARGET * 20), ("valid.de", SOURCE),
                        ("valid.en", TARGET)):  # fmt: skip
        (data / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = tmp_path / "läufe"  # a non-ASCII path too
    common = ["model.preset=tiny", "model.max_len=32", "data.tokenizer=bpe", "train.max_tokens=200",
              "data.train=[train.de, train.en]", "data.valid=[valid.de, valid.en]", "train.schedule=constant",
              "train.lr=0.003", "train.warmup=5", "train.eval_every=10"]  # fmt: skip
    trained = attnkit("train", "--run-dir", str(run), "--data", str(data), *common, "train.max_steps=10")
    assert trained.returncode == 0, trained.stderr.decode("utf-8", "replace")
    resumed = attnkit("train", "--resume", str(run), "train.max_steps=20")
    assert resumed.returncode == 0, resumed.stderr.decode("utf-8", "replace")
    config = json.loads((run / (run / "last").read_text(encoding="utf-8").strip() / "config.json").read_text(
        encoding="utf-8"
    ))  # fmt: skip
    assert config["data"]["train"] == ["train.de", "train.en"]
    tokenizer = Tokenizer.load(run / (run / "last").read_text(encoding="utf-8").strip() / "tokenizer.json")
    assert tokenizer.decode(tokenizer.encode("Das Mädchen fährt über die Straße.")) == (
        "Das Mädchen fährt über die Straße."
    )
    translated = attnkit("translate", "--ckpt", str(run), stdin="\n".join(SOURCE) + "\n")
    assert translated.returncode == 0, translated.stderr.decode("utf-8", "replace")
    assert len(translated.stdout.decode("utf-8").splitlines()) == len(SOURCE)
    echoed = attnkit(
        "translate", "--ckpt", str(run), "-i", str(data / "valid.de"), "-o", str(tmp_path / "ü.txt")
    )
    assert echoed.returncode == 0, echoed.stderr.decode("utf-8", "replace")
    assert (tmp_path / "ü.txt").read_text(
        encoding="utf-8"
    ).splitlines() == translated.stdout.decode().splitlines()
    page = tmp_path / "seite.html"
    explored = attnkit(
        "explore", "--ckpt", str(run), "--text", "Kinder laufen über die Straße.", "-o", str(page)
    )
    assert explored.returncode == 0, explored.stderr.decode("utf-8", "replace")
    assert "über" in page.read_text(encoding="utf-8")
    missing = attnkit("translate", "--ckpt", str(tmp_path / "gibt es nicht"), stdin="Straße\n")
    assert missing.returncode == 2 and "gibt es nicht" in missing.stderr.decode("utf-8")
