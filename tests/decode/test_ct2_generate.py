"""A GPT-style decoder exported to CTranslate2 (``attnkit export --to ctranslate2``) generates as attnkit
does: CTranslate2's ``Generator`` is the reference, on random-weight models of every option that changes
the exported layout, and through the command line on a trained run (``generate --engine ctranslate2``)."""

import json
import re
import sys

import pytest
import torch
from typer.testing import CliRunner

from attnkit.cli import app
from attnkit.config import DecodeConfig
from attnkit.convert.export import export_ctranslate2
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.generate import Listening, generate
from attnkit.errors import AttnkitError, ConversionError
from attnkit.models import build_model, from_preset

pytest.importorskip("ctranslate2", reason="CTranslate2 is the optional engine")
from attnkit.decode.ct2 import CTranslate2Generator, check_exported_folder
from tests.cli.checks import one_line_error

TEXT = ["the quick brown fox jumps over the lazy dog", "a cat sleeps on the warm mat", "rain falls"] * 10
runner = CliRunner()


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train("bpe", TEXT, vocab_size=300, min_frequency=1)


def _random_decoder(tokenizer, **fields):
    """A tiny decoder whose weights are random and far from their initialisation (LayerNorms and biases
    too), so that every weight's place in the export matters."""
    torch.manual_seed(0)
    model = build_model(from_preset("tiny-decoder", max_len=24, **fields), tokenizer.vocab_size).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize(
    "fields",
    [
        {},  # GPT-2's: pre-LN, learned positions, gelu_tanh, tied output
        {"norm_first": False, "activation": "relu"},  # the first GPT's post-LN
        {"positions": "sinusoidal", "scale_embeddings": True, "activation": "gelu"},
        {"positions": "sinusoidal", "sinusoid_layout": "concatenated"},
        {"tie_output": False, "output_bias": True, "layer_norm_eps": 1e-6},
    ],
)
def test_greedy_generation_is_attnkits_for_every_layout(tokenizer, tmp_path, fields):
    model = _random_decoder(tokenizer, **fields)
    # prompts of different lengths in a batch; the longest leaves less room than max_new_tokens
    prompts = [
        "the quick brown fox jumps over",
        "a",
        "rain falls on the cat",
        "the quick brown fox jumps over the",
    ]
    decode = DecodeConfig(temperature=0, max_new_tokens=12)
    folder = export_ctranslate2(model, tokenizer, vars(decode), tmp_path / "ct2")
    ours = generate(model, tokenizer, prompts, decode)
    assert len(tokenizer.encode(prompts[-1])) + 12 > 24  # the context bounds the last one
    # all in one batch, with a one-token prompt (which CTranslate2 treats apart), and two by two
    for batch_size in (4, 2):
        changes = {"batch_size": batch_size}
        assert CTranslate2Generator(folder, changes=changes).generate(prompts) == ours
    # one prompt at a time, streamed: the same text, in pieces
    pieces = []
    listening = Listening(lambda i, t: pieces.append((i, t)))
    streamed = CTranslate2Generator(folder).generate(prompts[:2], listening)
    assert streamed == ours[:2]
    assert "".join(t for i, t in pieces if i == 0) == ours[0] and {i for i, _ in pieces} <= {0, 1}


def test_loading_ctranslate2_leaves_torchs_threads_as_they_were(tokenizer, tmp_path, two_threads):
    """CTranslate2 sets the loading thread's OpenMP threads to its ``intra_threads`` (here 1: two
    streams of one thread each), which are torch's too; attnkit puts torch's count back, else every
    torch operation of that thread after it (a model's decoding, a training run) would run on one."""
    model = _random_decoder(tokenizer)
    decode = DecodeConfig(temperature=0, max_new_tokens=4, streams=2)
    folder = export_ctranslate2(model, tokenizer, vars(decode), tmp_path / "ct2")
    generator = CTranslate2Generator(folder)
    assert generator.streams == 2 and torch.get_num_threads() == 2
    generator.generate(["a", "rain falls"])
    assert torch.get_num_threads() == 2


def test_a_streamed_prompt_that_is_no_longer_wanted_ends_at_the_next_token(tokenizer, tmp_path):
    """A server's streaming client has gone: CTranslate2 stops extending its prompt."""
    model = _random_decoder(tokenizer)
    decode = DecodeConfig(temperature=0, max_new_tokens=12)
    folder = export_ctranslate2(model, tokenizer, vars(decode), tmp_path / "ct2")
    (whole,) = generate(model, tokenizer, ["a"], decode)
    asked = []

    def wanted(i):
        asked.append(i)
        return len(asked) < 3  # gone after its third token

    (cut,) = CTranslate2Generator(folder).generate(["a"], Listening(lambda i, t: None, wanted))
    assert len(asked) == 3 and whole.startswith(cut) and len(cut) < len(whole)


def test_stop_strings_end_the_text_where_attnkits_ends(tokenizer, tmp_path):
    model = _random_decoder(tokenizer)
    prompts = ["the quick", "a cat", "rain"]
    free = DecodeConfig(temperature=0, max_new_tokens=16)
    texts = generate(model, tokenizer, prompts, free)
    # a string some continuation holds (printable: a random model also writes bytes of no character)
    stop = next(t[i : i + 2] for t in texts for i in range(2, len(t) - 3) if t[i : i + 2].isalpha())
    decode = DecodeConfig(temperature=0, max_new_tokens=16, stop=[stop])
    folder = export_ctranslate2(model, tokenizer, vars(decode), tmp_path / "ct2")
    ours = generate(model, tokenizer, prompts, decode)
    assert any(len(a) < len(b) for a, b in zip(ours, texts, strict=True))  # the stop string cut one
    assert CTranslate2Generator(folder).generate(prompts) == ours
    assert CTranslate2Generator(folder).generate(prompts[:1], Listening(lambda i, t: None)) == ours[:1]


def test_models_ctranslate2_cannot_run_are_refused(tokenizer, tmp_path):
    model = _random_decoder(tokenizer, attention_window=4)
    with pytest.raises(ConversionError, match=r"CTranslate2 attends with a softmax over all keys"):
        export_ctranslate2(model, tokenizer, vars(DecodeConfig()), tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


TINY = ["model.arch=decoder", "model.preset=tiny-decoder", "model.max_len=32", "data.train=[text.txt]",
        "data.tokenizer=char", "train.max_tokens=256", "train.lr=3e-3", "train.warmup=5",
        "train.label_smoothing=0", "train.max_steps=30"]  # fmt: skip


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A decoder trained for a moment, and its CTranslate2 export."""
    root = tmp_path_factory.mktemp("gpt")
    (root / "text.txt").write_text(
        "".join(f"line {i}: the quick brown fox jumps.\n" for i in range(60)), encoding="utf-8"
    )
    run, out = root / "run", root / "ct2"
    result = runner.invoke(app, ["train", "--run-dir", str(run), "--data", str(root), *TINY])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["export", "--ckpt", str(run), "--to", "ctranslate2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"generate with attnkit generate --engine ctranslate2 --ckpt {out}" in result.output
    return run, out


def test_generate_with_ctranslate2_from_the_command_line(exported, tmp_path):
    run, out = exported
    greedy = ["--max-new-tokens", "20", "--temperature", "0"]
    ours = runner.invoke(app, ["generate", "--ckpt", str(run), "--prompt", "line 7:", *greedy])
    theirs = runner.invoke(app, ["generate", "--engine", "ctranslate2", "--ckpt", str(out), "--prompt",
                                 "line 7:", *greedy])  # fmt: skip
    assert ours.exit_code == theirs.exit_code == 0, theirs.output
    assert theirs.stdout == ours.stdout and len(ours.stdout) > len("line 7:") + 5

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("line 1\nthe quick\nline 42: the\n", encoding="utf-8")
    rows = {}
    for engine, ckpt in (("attnkit", run), ("ctranslate2", out)):
        written = tmp_path / f"{engine}.jsonl"
        result = runner.invoke(app, ["generate", "--engine", engine, "--ckpt", str(ckpt), "-i", str(prompts),
                                     "-o", str(written), *greedy, "--stop", "."])  # fmt: skip
        assert result.exit_code == 0, result.output
        rows[engine] = [json.loads(line) for line in written.read_text(encoding="utf-8").splitlines()]
    assert rows["ctranslate2"] == rows["attnkit"] and len(rows["attnkit"]) == 3

    def sample(seed: str) -> str:
        settings = ["--seed", seed, "--streams", "1", "--temperature", "1.0", "--top-k", "0"]
        result = runner.invoke(app, ["generate", "--engine", "ctranslate2", "--ckpt", str(out), "-i",
                                     str(prompts), *settings])  # fmt: skip
        assert result.exit_code == 0, result.output
        return result.stdout

    assert sample("3") == sample("3") != sample("4")  # CTranslate2's generator, seeded when it loads


def test_evaluate_gives_the_same_perplexity_through_ctranslate2(exported, tmp_path):
    """``evaluate --engine ctranslate2 --data FILE.txt``: CTranslate2's log-probabilities of the same blocks
    give attnkit's perplexity."""
    run, out = exported
    text = tmp_path / "held_out.txt"
    text.write_text("".join(f"line {i}: the lazy dog sleeps.\n" for i in range(30)), encoding="utf-8")
    scored = {}
    for engine, ckpt in (("attnkit", run), ("ctranslate2", out)):
        result = runner.invoke(
            app, ["evaluate", "--engine", engine, "--ckpt", str(ckpt), "--data", str(text)]
        )
        assert result.exit_code == 0, result.output
        line = r"perplexity = ([\d.]+) \(cross-entropy ([\d.]+) nats per token, ([\d,]+) tokens predicted "
        found = re.fullmatch(line + r"in blocks of 32\)\n", result.stdout)
        assert found, result.stdout
        scored[engine] = (float(found[1]), float(found[2]), found[3])
    assert (
        scored["ctranslate2"][2] == scored["attnkit"][2] == f"{len(text.read_text(encoding='utf-8')) - 1:,}"
    )
    assert scored["ctranslate2"][1] == pytest.approx(scored["attnkit"][1], abs=2e-4)
    assert scored["ctranslate2"][0] == pytest.approx(scored["attnkit"][0], rel=1e-3)


def test_each_engine_refuses_the_others_folders_in_one_line(exported, tokenizer, tmp_path):
    out = exported[1]
    translation = build_model(from_preset("tiny", pad_id=tokenizer.specials.pad), tokenizer.vocab_size)
    translation_folder = export_ctranslate2(translation, tokenizer, vars(DecodeConfig()), tmp_path / "t")
    cases = [
        (["generate", "--engine", "ctranslate2", "--ckpt", str(out), "--int8"],
         r"--int8 is attnkit's; CTranslate2 takes int8 at export: --quantization int8"),
        (["translate", "--engine", "ctranslate2", "--ckpt", str(out)],
         rf"{re.escape(str(out))}: a CTranslate2 decoder \(GPT-style\) model; use it with attnkit generate "
         r"--engine ctranslate2"),
        (["generate", "--engine", "ctranslate2", "--ckpt", str(translation_folder)],
         rf"{re.escape(str(translation_folder))}: a CTranslate2 translation model; use it with attnkit "
         r"translate --engine ctranslate2"),
        (["generate", "--ckpt", str(out)],
         r"a CTranslate2 model folder, not an attnkit checkpoint; generate with it by attnkit generate "
         rf"--engine ctranslate2 --ckpt {re.escape(str(out))}"),
        (["generate", "--engine", "ctranslate2", "--ckpt", str(out), "--top-p", "0"],
         r"--top-p must be in \(0, 1\]; got 0\.0"),
        (["generate", "--engine", "ct2", "--ckpt", str(out)],
         r"--engine 'ct2': choose attnkit or ctranslate2"),
    ]  # fmt: skip
    for args, message in cases:
        result = runner.invoke(app, args)
        one_line_error(result, message)


def test_a_machine_without_ctranslate2_or_a_folder_that_is_no_export_is_told_in_one_line(
    tmp_path, monkeypatch
):
    folder = "not a CTranslate2 folder from 'attnkit export --to ctranslate2'"
    with pytest.raises(AttnkitError, match=rf": {folder}$"):
        check_exported_folder(tmp_path)
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 now raises ImportError
    with pytest.raises(AttnkitError, match=r"needs CTranslate2: pip install 'attnkit\[ctranslate2\]'"):
        check_exported_folder(tmp_path)
