"""The benchmark scripts run end to end (at toy sizes: this checks them, it measures nothing)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each runs a benchmark script end to end (the slow set)

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize(
    ("script", "arguments", "summary"),
    [
        ("attention.py", ["--quick"], r"median MultiHeadAttention/torch_mha time = \d+\.\d+"),
        (
            "forward.py",
            ["--preset", "tiny", "--shapes", "2x4"],
            r"median EncoderDecoder/torch_transformer time = \d",
        ),
        ("encoder_speed.py", ["--batch", "4"], r"ours/hf_bert sentences/s = \d+\.\d+"),
        (
            "local_attention.py",
            ["--lengths", "40", "--window", "4"],
            r"T=40 peak MiB: .* blocked/full memory",
        ),
        (
            "lm_speed.py",
            [
                "--preset",
                "tiny-decoder",
                "--vocab",
                "100",
                "--batch",
                "2x8",
                "--gen-batch",
                "1,2",
                "--new-tokens",
                "3",
            ],
            r"ours/hf_generate tok/s \(batch 2\) = \d+\.\d+\n(.|\n)*"
            r"ours/ctranslate2 tok/s \(batch 2\) = \d+\.\d+\nthe same tokens as ctranslate2: True",
        ),
        (
            "lm_speed.py",
            [
                "--preset",
                "tiny-decoder",
                "--vocab",
                "100",
                "--gen-batch",
                "2",
                "--new-tokens",
                "3",
                "--generation-only",
                "--precision",
                "bf16",
            ],
            r"with packed bf16 weights\n(.|\n)*bf16: \d+ of 6 tokens are float32's \(batch 2\)\n(.|\n)*"
            r"ours/ctranslate2-int8 tok/s \(batch 2\) = \d+\.\d+\nthe same tokens as ctranslate2-int8: ",
        ),
    ],
)
def test_benchmark_prints_ours_over_peer_ratios(script, arguments, summary):
    result = subprocess.run(
        [sys.executable, str(BENCH / script), "--rounds", "1", *arguments],
        capture_output=True, text=True, timeout=300, check=False, encoding="utf-8"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.search(summary, result.stdout), result.stdout
    cases = [line for line in result.stdout.splitlines() if re.search(r"ours/\w+ time = \d", line)]
    assert len(cases) >= 1, result.stdout


def test_the_speed_benchmarks_give_ours_and_the_peer_the_same_dropout_at_the_same_places():
    sys.path.insert(0, str(BENCH))
    from forward import TorchTransformerPeer, like_for_like

    from attnkit import build_transformer

    config = like_for_like("small")
    ours = build_transformer(config, 100).encoder.layers[0]
    peer = TorchTransformerPeer(config, 100).transformer.encoder.layers[0]
    assert ours.self_attn.dropout == peer.self_attn.dropout == 0.1  # on the attention weights
    assert ours.feed_forward.dropout.p == peer.dropout.p == 0.1  # on the FFN's hidden activations
    assert ours.sublayer[0].dropout.p == peer.dropout1.p == 0.1  # on the residual sub-layer outputs


def test_the_shakespeare_quality_benchmark_runs_end_to_end_on_a_tiny_text(tmp_path):
    (tmp_path / "input.txt").write_text(
        "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40, encoding="utf-8"
    )
    result = subprocess.run(
        [sys.executable, str(BENCH / "quality_shakespeare.py"), "--data", str(tmp_path), "--run-dir",
         str(tmp_path / "run"), "--config", str(BENCH.parent / "configs" / "shakespeare_char_cpu.yaml"),
         "train.max_steps=6", "train.decay_steps=6", "train.eval_every=3", "decode.max_new_tokens=20"],
        capture_output=True, text=True, timeout=300, check=False, encoding="utf-8"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.search(r"best valid loss = \d\.\d{4}", result.stdout)
    assert re.search(r"seconds to valid loss <= 1\.8|valid loss 1\.8: not reached", result.stdout)


def test_the_attention_variants_benchmark_trains_scores_and_plots_each_variant(tmp_path):
    result = subprocess.run(
        [sys.executable, str(BENCH / "attention_variants.py"), "--task", "dates", "--minutes", "0.02",
         "--variants", "transformer-window,rnn-hard,rnn-none", "--runs", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False, encoding="utf-8"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = re.findall(
        r"\| dates \| ([\w-]+) \| [\d,]+ \| [\d,]+ \| [\d.]+ \| \d+\.\d\d exact match % \| [^|]+ \|",
        result.stdout,
    )
    assert rows == ["transformer-window", "rnn-hard", "rnn-none"], result.stdout
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "dates-rnn-hard.png",
        "dates-transformer-window.png",
    ]


def test_the_glimpse_benchmark_trains_both_models_and_draws_the_glimpse_paths(tmp_path):
    pytest.importorskip("sklearn", reason="the cluttered-digits task draws scikit-learn's bundled digits")
    result = subprocess.run(
        [sys.executable, str(BENCH / "glimpse_vs_whole_image.py"), "--minutes", "0.02",
         "--runs", str(tmp_path), "--plot", str(tmp_path / "paths.png")],
        capture_output=True, text=True, timeout=300, check=False, encoding="utf-8"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = re.findall(
        r"\| ([\w-]+) \| ([\d,]+) \| [\d,]+ \| [\d.]+ \| [\d.]+ \| (\d\.\d{3}) \|", result.stdout
    )
    assert [name for name, _, _ in rows] == ["glimpse", "whole-image"], result.stdout
    sizes = [int(parameters.replace(",", "")) for _, parameters, _ in rows]
    assert abs(sizes[0] / sizes[1] - 1) < 0.01  # the same size
    assert (tmp_path / "paths.png").stat().st_size > 10_000
    assert re.search(r"glimpses centred on the digit, 1st to last, of 1000 test canvases: (\d+%, ){5}\d+% "
                     r"\(a random place: 16%\)", result.stdout), result.stdout  # fmt: skip


@pytest.fixture(scope="module")
def copy_run(copy_data, tmp_path_factory):
    """A tiny Transformer trained 100 steps on the copy task."""
    from attnkit.config import load_run_config
    from attnkit.train.loop import Trainer

    settings = ["model.preset=tiny", "data.train=[train.src, train.tgt]", "data.valid=[valid.src, valid.tgt]",
                f"data.dir={copy_data}", "data.tokenizer=word", "train.schedule=constant", "train.warmup=0",
                "train.lr=3e-3", "train.max_tokens=512", "train.max_steps=100",
                "train.eval_every=100"]  # fmt: skip
    run = tmp_path_factory.mktemp("copy_run") / "run"
    Trainer(load_run_config(None, settings), run, echo=lambda m: None).fit()
    return run


def test_the_length_penalty_search_names_a_command_that_translates_with_its_best_pair(copy_run, copy_data):
    from sacrebleu.metrics import BLEU
    from typer.testing import CliRunner

    from attnkit.cli import app

    result = subprocess.run(
        [sys.executable, str(BENCH / "length_penalty.py"), "--ckpt", str(copy_run), "--src",
         str(copy_data / "valid.src"), "--ref", str(copy_data / "valid.tgt"), "--beam", "2",
         "--alphas", "0,1"],
        capture_output=True, text=True, timeout=300, check=False, encoding="utf-8"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = re.findall(r"^\| (length|gnmt) \| ([\d.]+) \| ([\d.]+) \| [\d.]+ \|$", result.stdout, re.M)
    assert [(kind, alpha) for kind, alpha, _ in rows] == [(k, a) for k in ("length", "gnmt") for a in "01"]
    command = re.search(r"translate with it: attnkit (translate .*)$", result.stdout, re.M)[1].split()
    best = max(float(score) for *_, score in rows)
    translated = CliRunner().invoke(app, [*command, "-i", str(copy_data / "valid.src")])
    assert translated.exit_code == 0, translated.output
    references = (copy_data / "valid.tgt").read_text(encoding="utf-8").splitlines()
    assert round(BLEU().corpus_score(translated.stdout.splitlines(), [references]).score, 2) == best


def run_translate_speed(copy_run, copy_data, cache: Path, *options: str) -> str:
    """bench/translate_speed.py's output on the first 8 validation sentences, one thread, batch 4."""
    result = subprocess.run(
        [sys.executable, str(BENCH / "translate_speed.py"), "--ckpt", str(copy_run),
         "--src", str(copy_data / "valid.src"), "--ref", str(copy_data / "valid.tgt"), "--n", "8",
         "--batch", "4", "--threads", "1", *options],
        capture_output=True, text=True, encoding="utf-8", timeout=300, check=False,
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},  # the compiled steps' cache
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


SPEED_RATIO = r"([\d.]+) \(([\d.]+)–([\d.]+)\)"  # median (lowest–highest) of the rounds' speed ratios


def speed_rows(stdout: str) -> list[tuple[str, ...]]:
    """The table's rows: (engine, beam, sacreBLEU, median, lowest, highest)."""
    return re.findall(rf"\| ([\w-]+) \| (\d) \| [\d.]+ \| [\d,]+ \| ([\d.]+) \| {SPEED_RATIO} \|", stdout)


def test_the_translation_speed_benchmark_runs_every_engine_on_one_checkpoint(copy_run, copy_data, tmp_path):
    pytest.importorskip("ctranslate2", reason="CTranslate2 is one of the engines")
    stdout = run_translate_speed(copy_run, copy_data, tmp_path, "--beams", "1,2", "--rounds", "2")
    header = stdout.splitlines()[0]
    assert "batch 4, " in header and "(each engine's batch size and α as it reported them)" in header
    rows = speed_rows(stdout)
    ours = ["attnkit", "attnkit-bf16", "attnkit-int8"]
    engines = [*ours, "hf-generate", "ctranslate2", "ctranslate2-int8"]
    assert [(row[0], row[1]) for row in rows] == [(e, b) for b in "12" for e in engines], stdout
    for name in ours[1:]:  # each against float32 attnkit
        assert re.search(rf"beam 2: {name}: [\d.]+% of the outputs are float32 attnkit's, BLEU [+-][\d.]+\n",
                         stdout), stdout  # fmt: skip
    assert re.search(r"beam 1: the fastest attnkit row is attnkit[\w-]*; its speed / ctranslate2's "
                     rf"{SPEED_RATIO}, ctranslate2-int8's {SPEED_RATIO}\n", stdout), stdout  # fmt: skip
    for name, _, _, median, lowest, highest in rows:
        assert float(lowest) <= float(median) <= float(highest)
        if name == "attnkit":
            assert median == lowest == highest == "1.00"
    scores = {(name, beam): score for name, beam, score, *_ in rows}
    assert scores[("attnkit", "1")] == scores[("ctranslate2", "1")] == scores[("hf-generate", "1")]


def test_the_speculative_benchmark_times_drafts_beside_plain_greedy_and_ctranslate2(copy_run, copy_data):
    """The copy task copies its source: drafts are taken (more than one token a step), and every output
    is plain greedy's. Every batch drafts (``--always``): the economy's choice, by the batches' times,
    would draft in as few as one batch of these ten, which might end both its rows at once."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is beside")
    stdout = bench_output("speculative.py", "--ckpt", str(copy_run), "--src", str(copy_data / "valid.src"),
                          "--n", "20", "--batch", "2", "--rounds", "1", "--threads", "1",
                          "--ct2", "--always")  # fmt: skip
    row = r"^(greedy(?:, source drafts)?|ctranslate2-\w+) +[\d.]+ +[\d.]+ +\d+ +[\d.]+ +[\d.]+ +(\d+)$"
    rows = dict(re.findall(row, stdout, re.M))  # engine: its outputs that differ from greedy's
    assert set(rows) == {"greedy", "greedy, source drafts", "ctranslate2-float32", "ctranslate2-int8"}
    assert rows["greedy"] == rows["greedy, source drafts"] == "0", stdout
    taken = re.search(r"source drafts: ([\d.]+)% of (\d+) drafted tokens taken, ([\d.]+) tokens a row a step",
                      stdout)  # fmt: skip
    assert float(taken[1]) > 0 and float(taken[3]) > 1.0, stdout


def test_the_speculative_benchmark_continues_a_gpts_prompts_with_its_drafts(tmp_path):
    """A GPT run (and its distilled draft, and a smaller GPT run as a draft model): prompts cut from the
    file's end, continued greedily with and without drafts from the context and the drafts' guesses,
    every text plain greedy's."""
    from typer.testing import CliRunner

    from attnkit.cli import app

    run = _gpt_run(tmp_path, "run")
    made = CliRunner().invoke(app, ["distill-draft", "--ckpt", run, "--minutes", "0.03"])
    assert made.exit_code == 0, made.output
    small = _gpt_run(tmp_path, "small", "model.layers=1")  # a smaller GPT of the same characters, the draft
    stdout = bench_output("speculative.py", "--ckpt", run, "--src", str(tmp_path / "text.txt"),
                          "--prompt-chars", "12", "--n", "4", "--rounds", "1", "--threads", "1",
                          "--new-tokens", "16", "--always", "--draft-ckpt", small)  # fmt: skip
    assert "4 prompts, up to 16 new tokens each" in stdout, stdout
    kinds = "source drafts|shallow draft|draft model"
    row = rf"^(greedy(?:, (?:{kinds}))?) +[\d.]+ +[\d.]+ +\d+ +[\d.]+ +[\d.]+ +(\d+)$"
    rows = dict(re.findall(row, stdout, re.M))
    assert rows == {"greedy": "0", "greedy, source drafts": "0", "greedy, shallow draft": "0",
                    "greedy, draft model": "0"}, stdout  # fmt: skip
    for drafts in ("shallow draft", "draft model"):
        assert re.search(rf"{drafts}: [\d.]+% of [1-9]\d* drafted tokens taken", stdout), stdout


def test_the_served_drafts_benchmark_times_one_client_of_a_gpt_server_with_and_without_drafts(tmp_path):
    """A GPT run served three times, plainly, with drafts from the context and with another checkpoint's
    model as the draft: one client's latency at each, every drafted answer the plain server's."""
    run = _gpt_run(tmp_path, "run")
    draft = _gpt_run(tmp_path, "small", "model.layers=1")  # a smaller GPT of the same characters
    stdout = bench_output("serve_drafts.py", "--ckpt", run, "--src", str(tmp_path / "text.txt"),
                          "--prompt-chars", "12", "--n", "3", "--new-tokens", "16",
                          "--seconds", "2", "--drafts", "source", "--drafts", draft)  # fmt: skip
    assert "3 prompts from" in stdout, stdout
    names = "plain|source drafts|drafts of small"
    rows = dict(re.findall(rf"^({names}) +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +(\d+)$", stdout, re.M))
    assert rows == {"plain": "0", "source drafts": "0", "drafts of small": "0"}, stdout


def test_the_served_drafts_benchmark_times_one_client_of_a_translator_with_and_without_drafts(
    copy_run, copy_data
):
    """The copy task's model served plainly and with drafts from the source (which its outputs copy):
    one client's greedy requests, every drafted answer (translation and score) the plain server's."""
    stdout = bench_output("serve_drafts.py", "--ckpt", str(copy_run), "--src", str(copy_data / "valid.src"),
                          "--n", "5", "--seconds", "2", "--drafts", "source")  # fmt: skip
    assert "5 sentences from" in stdout, stdout
    rows = dict(re.findall(r"^(plain|source drafts) +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +(\d+)$", stdout, re.M))
    assert rows == {"plain": "0", "source drafts": "0"}, stdout


def _gpt_run(folder: Path, name: str, *changes: str) -> str:
    """A tiny character-level GPT trained for a moment on ``folder/text.txt`` (written where it is not
    yet) into ``folder/name``, with ``changes`` to its settings."""
    from typer.testing import CliRunner

    from attnkit.cli import app

    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))
    if not (folder / "text.txt").exists():
        (folder / "text.txt").write_text(text, encoding="utf-8")
    run = str(folder / name)
    tiny = ["model.arch=decoder", "model.preset=tiny-decoder", "model.max_len=32", "data.train=[text.txt]",
            "data.tokenizer=char", "train.max_tokens=256", "train.max_steps=30",
            "train.eval_every=30", *changes]  # fmt: skip
    trained = CliRunner().invoke(app, ["train", "--run-dir", run, "--data", str(folder), *tiny])
    assert trained.exit_code == 0, trained.output
    return run


def bench_output(script: str, *arguments: str) -> str:
    """What ``bench/script arguments`` prints, once it has ended well."""
    result = subprocess.run([sys.executable, str(BENCH / script), *arguments], capture_output=True, text=True,
                            encoding="utf-8", timeout=300, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_invariance_benchmark_counts_the_outputs_that_change_with_the_batch_for_every_engine(
    copy_run, copy_data
):
    pytest.importorskip("ctranslate2", reason="CTranslate2 is one of the peers")
    pytest.importorskip("transformers", reason="HF generate is one of the peers")
    stdout = bench_output("invariance.py", "--ckpt", str(copy_run), "--src", str(copy_data / "valid.src"),
                          "--lines", "12", "--batch", "5", "--beam", "3", "--steps", "eager",
                          "--bf16-one-product")  # fmt: skip
    rows = re.findall(r"\| ([\w ,]+?) \| (\d+) of 24 \| \d+ of 12 \| [\d.]+ \| [\d.]+ \|", stdout)
    names = [name for name, _ in rows]
    assert names[3:] == ["CTranslate2 float32", "CTranslate2 int8", "HF generate float32"], stdout
    # attnkit in each precision (bf16 is fp32 where this torch packs no bf16 weights): the same answers
    assert names[0] == "attnkit fp32" and names[2] == "attnkit int8" and names[1].startswith("attnkit")
    assert [differ for _, differ in rows[:3]] == ["0", "0", "0"], stdout
    # and bf16 with one product per map, as before blocks of inputs, named for what this CPU's sums do
    assert re.search(r"\| attnkit bf16, one product per map \(rows summed [^|]+\) \| \d+ of 24 \|", stdout)


def test_the_translation_speed_benchmark_compares_the_compiled_step_with_the_eager_one(
    copy_run, copy_data, tmp_path
):
    pytest.importorskip("ctranslate2", reason="CTranslate2 is one of the engines")
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("decode.steps=compiled needs a C++ compiler")
    # one precision and greedy search: each compiled step costs most of a minute to build on 2 cores
    stdout = run_translate_speed(copy_run, copy_data, tmp_path, "--beams", "1", "--rounds", "1",
                                 "--precisions", "fp32", "--compile")  # fmt: skip
    engines = ["attnkit", "attnkit-compiled", "hf-generate", "ctranslate2", "ctranslate2-int8"]
    assert [(row[0], row[1]) for row in speed_rows(stdout)] == [(e, "1") for e in engines], stdout
    same = rf"beam 1: attnkit-compiled's outputs are attnkit's; its speed / attnkit's {SPEED_RATIO}, "
    assert re.search(same, stdout), stdout
    assert "beam 1: attnkit-compiled: 100.0% of the outputs are float32 attnkit's, BLEU +0.00\n" in stdout


def test_the_aeslc_quality_benchmark_trains_and_scores_rouge_on_tiny_records(tmp_path):
    pytest.importorskip("rouge_score", reason="summarisation is scored with rouge-score")
    import gzip
    import json

    words = ["budget", "gas", "power", "risk"] * 10
    records = [{"email": f"the {w} report is late", "subject": f"{w} report", "annotations": [w, f"{w} late"]}
               for w in words]  # fmt: skip
    for name in ("train.jsonl.gz", "dev.jsonl.gz"):
        with gzip.open(tmp_path / name, "wt", encoding="utf-8") as f:
            f.write("\n".join(map(json.dumps, records)) + "\n")
    result = subprocess.run(
        [sys.executable, str(BENCH / "quality_aeslc.py"), "--data", str(tmp_path),
         "--run-dir", str(tmp_path / "run"), "model.preset=tiny", "data.tokenizer=word",
         "train.max_steps=6", "train.eval_every=3"],
        capture_output=True, text=True, timeout=300, check=False, encoding="utf-8"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.search(
        r"against 'subject': ROUGE-1 \d+\.\d\d, ROUGE-2 \d+\.\d\d, ROUGE-L \d+\.\d\d", result.stdout
    )
    assert "against 'annotations'" in result.stdout and "40 records" in result.stdout
    # "the budget report" against "budget report": unigrams P = 2/3, R = 1; bigrams P = 1/2, R = 1
    assert "LEAD-3 (the first 3 words) against 'subject': ROUGE-1 80.00, ROUGE-2 66.67" in result.stdout


def test_the_data_scale_benchmark_prepares_trains_on_one_and_two_ranks_and_compares_speed(tmp_path):
    import gzip

    words = ["ein", "Mann", "eine", "Frau", "Hund", "läuft", "sitzt", "im", "Park", "auf", "der", "Straße"]
    for split, n in (("train", 60), ("val", 10)):
        for side, shift in (("de", 0), ("en", 3)):
            lines = [
                " ".join(words[(k + j + shift) % len(words)] for j in range(3 + k % 5)) for k in range(n)
            ]
            with gzip.open(tmp_path / f"{split}.{side}.gz", "wt", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
    result = subprocess.run(
        [sys.executable, str(BENCH / "data_scale.py"), "--data", str(tmp_path), "--sizes", "0.001",
         "--speed-steps", "2", "--rounds", "1", "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600, check=False, encoding="utf-8",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    row = re.search(r"^\| 1,000 \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| "
                    r"([\d.]+|-) \| ([\d.]+) \| ([\d.]+) \+ ([\d.]+) \| ([\d.]+|-) \|$",
                    result.stdout, re.M)  # fmt: skip
    assert row, result.stdout
    for peak_rss_gb in (row[2], row[4], row[6]):  # prepare; first run (store built); second (found)
        assert 0.05 < float(peak_rss_gb) < 8  # read from each process
    assert re.search(r"store/lists tok/s = \d+\.\d\d", result.stdout), result.stdout
    corpus = (tmp_path / "work" / "1000" / "train.de").read_text(encoding="utf-8").splitlines()
    assert len(corpus) == 1000 and corpus[60].endswith(" 1") and len(set(corpus)) == 1000


def test_the_serving_load_benchmark_loads_attnkit_serve_and_the_ctranslate2_peer(
    copy_run, copy_data, tmp_path
):
    pytest.importorskip("ctranslate2", reason="the peer serves CTranslate2")
    pytest.importorskip("httpx", reason="the load generator is an httpx client")
    pytest.importorskip("sklearn", reason="the captioner's soak draws scikit-learn's digits")
    from tests.images import untrained_captioner
    from tests.recognisers import untrained_recogniser

    captioner = untrained_captioner(tmp_path / "captioner")
    recogniser = untrained_recogniser(tmp_path / "recogniser")
    result = subprocess.run(
        [sys.executable, str(BENCH / "serve_load.py"), "--ckpt", str(copy_run), "--src",
         str(copy_data / "valid.src"), "--clients", "1,2,4", "--seconds", "1.5", "--beam", "2",
         "--threads", "1", "--soak", "120", "--engines", "attnkit,ctranslate2",
         "--server-option", "decode.precision=fp32", "--server-option", "decode.steps=eager",
         "--scenario-seconds", "0.5", "--p99-bound-ms", "2000", "--engine-only",
         "--soak-captioner", str(captioner),
         "--soak-recogniser", str(recogniser)],
        capture_output=True, text=True, encoding="utf-8", timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    server = r"attnkit serve --engine ctranslate2|attnkit serve|FastAPI \+ CTranslate2 translate_batch"
    # name, clients, requests/s, / offline, tokens/s, p50, p99, p99 / p50, errors, answers not the offline one
    row = rf"^\| ({server}) \| (\d) \| ([\d.]+) \| [\d.]+ \| (\d+) \| (\d+) \| (\d+) \| [\d.]+ \| (\d+) \| "
    rows = re.findall(row + r"((?:\d+ of \d+)?) \|$", result.stdout, re.M)
    shown = ("attnkit serve", "attnkit serve --engine ctranslate2", "FastAPI + CTranslate2 translate_batch")
    assert [(name, clients) for name, clients, *_ in rows] == [(name, c) for name in shown for c in "124"], (
        result.stdout
    )
    assert all(float(rps) > 0 and errors == "0" for _, _, rps, *_, errors, _ in rows)
    # attnkit's answers are checked against the offline translations (in float32: the same)
    checked = [differ for name, *_, differ in rows if name == "attnkit serve"]
    assert len(checked) == 3 and all(re.fullmatch(r"0 of [1-9]\d*", differ) for differ in checked), checked
    assert re.search(
        r"^offline \(attnkit translate.*: [\d.]+ sentences/s; a batch of 8: \d+ ms; one sentence alone: "
        r"[\d.]+ ms; its steps eager$",
        result.stdout,
        re.M,
    )
    single = r"^attnkit serve: p50 at 1 client / attnkit translate of one sentence alone "
    single += r"\([\d.]+ ms, median\): "
    assert float(re.search(single + r"(\d+\.\d\d)$", result.stdout, re.M)[1]) > 0
    for engine in ("attnkit serve", "attnkit serve --engine ctranslate2"):
        assert re.search(rf"^{engine} / peer at 4 clients: \d+\.\d\dx requests/s$", result.stdout, re.M)
    # the server scenario: Poisson arrivals at rising shares of the offline rate until p99 passes 2 s
    for name in shown:
        row = rf"^\| {re.escape(name)} \| ([\d.]+) \| (\d\.\d) \| \d+ \| \d+ \| \d+ \| (yes|no.*) \|$"
        rates = re.findall(row, result.stdout, re.M)
        shares = [f"{i / 10:.1f}" for i in range(1, len(rates) + 1)]
        assert rates and [share for _, share, _ in rates] == shares, rates
        assert all(within == "yes" for *_, within in rates[:-1]), rates  # it stops at the first over
        highest = rf"^{re.escape(name)}: the highest Poisson rate with p99 <= 2000 ms: "
        assert re.search(highest + r"([\d.]+ requests/s, \d\.\dx offline|none)$", result.stdout, re.M)
    # where the CPU went at each level: the server's process, its worker processes, the load generator
    cores = r"^attnkit serve at 4 clients, cores used: server 0\.\d\d, worker processes (\d\.\d\d), "
    cores += r"load generator 0\.\d\d$"
    assert float(re.search(cores, result.stdout, re.M)[1]) > 0.05, result.stdout
    # the engine alone, in process: every answer the offline one; and what the HTTP layer leaves
    alone = re.findall(
        r"^\| attnkit running batches \| (\d) \| ([\d.]+) \| .* \| (\d+) of \d+ \|$", result.stdout, re.M
    )
    assert [(clients, differ) for clients, _, differ in alone] == [("1", "0"), ("2", "0"), ("4", "0")], alone
    assert re.search(r"^at 4 clients: attnkit serve / its engine alone \d+\.\d\dx", result.stdout, re.M)
    soak = json.loads(re.search(r"^soak: (.*)$", result.stdout, re.M)[1])
    assert soak["5xx"] == 0 and soak["wrong"] == 0 and soak["unexpected"] == 0, soak
    assert soak["malformed"] > 0 and soak["good"] > 60 and soak["after_status"] == 200, soak
    for model in ("captioner", "recogniser"):  # soaked beside the translator, with hostile uploads
        found = re.search(rf"^soak \({model}, beside the translator's\): (.*)$", result.stdout, re.M)
        uploads = json.loads(found[1])
        assert uploads["5xx"] == 0 and uploads["wrong"] == 0 and uploads["unexpected"] == 0, uploads
        assert uploads["malformed"] > 0 and uploads["good"] > 60 and uploads["after_status"] == 200, uploads


def test_the_engine_breakdown_splits_each_search_s_time_per_sentence_into_its_parts(copy_run, copy_data):
    result = subprocess.run(
        [sys.executable, str(BENCH / "engine_load.py"), "--ckpt", str(copy_run), "--src",
         str(copy_data / "valid.src"), "--clients", "1,3", "--seconds", "1", "--beam", "2", "--breakdown",
         "--by-length", "decode.precision=fp32", "decode.steps=eager"],
        capture_output=True, text=True, encoding="utf-8", timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("20 sentences, shortest first; beam 2;"), result.stdout
    n = r"([\d.]+)"
    row = (rf"^\| (attnkit translate \(offline\)|running batch, \d clients) \| {n} \| {n} \({n} sources\) \| "
           rf"{n} \({n} rows\) \| {n}, {n} \| {n} \| {n}? \| {n} \| (\d*) \|$")  # fmt: skip
    rows = {name: cells for name, *cells in re.findall(row, result.stdout, re.M)}
    names = ["attnkit translate (offline)", "running batch, 1 clients", "running batch, 3 clients"]
    assert list(rows) == names, result.stdout
    for name, (rate, encoding, _, steps, _, own, crossed, rest, between, whole, differ) in rows.items():
        # the keys a row reads: at least the position it decodes (self), and its source's </s> (cross)
        assert float(own) >= 1.0 and float(crossed) >= 1.0, (name, result.stdout)
        parts = float(encoding) + float(steps) + float(rest) + float(between or 0)
        assert float(rate) > 0 and abs(parts - float(whole)) <= 0.02, (name, result.stdout)
        # fp32: every answer the offline one
        assert differ == ("" if name == names[0] else "0"), result.stdout
    # offline encodes its 20 sentences in one batch; one client's sentences join one at a time, on 2 rows
    # (the beam) at most per step, three clients' on 6 at most
    offline, alone, three = rows.values()
    assert float(offline[2]) == 20.0 and float(alone[2]) == 1.0 and 1.0 <= float(three[2]) <= 3.0
    assert float(alone[4]) <= 2.0 and float(three[4]) <= 6.0, result.stdout


def test_the_app_cost_benchmark_times_the_servers_app_against_a_plain_fastapi_endpoint(copy_run):
    pytest.importorskip("fastapi", reason="attnkit serve needs FastAPI: pip install 'attnkit[serve]'")
    result = subprocess.run(
        [sys.executable, str(BENCH / "app_cost.py"), "--ckpt", str(copy_run), "--requests", "100",
         "--repeats", "1"],
        capture_output=True, text=True, encoding="utf-8", timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    ours = re.search(r"^attnkit serve's app: (\d+) µs of CPU per request", result.stdout, re.M)
    peer = re.search(r"^plain FastAPI endpoint: (\d+) µs of CPU per request", result.stdout, re.M)
    ratio = re.search(
        r"^attnkit serve's app / plain FastAPI endpoint CPU per request: ([\d.]+)$", result.stdout, re.M
    )
    assert ours and peer and ratio, result.stdout
    assert int(ours[1]) > 0 and int(peer[1]) > 0 and float(ratio[1]) > 0


def test_the_load_generators_client_keeps_its_connection_and_reopens_one_the_server_closes():
    """bench/keep_alive.py, the load generator's HTTP: requests go over one connection, each answer is
    read by its length whatever its status, and a connection the server closes, saying so (``connection:
    close``) or not (as uvicorn lets an idle one go), is opened again for the next request."""
    import asyncio

    sys.path.insert(0, str(BENCH))
    from keep_alive import KeepAlive

    connections = []

    async def serve(reader, writer):
        connections.append(writer)
        while not reader.at_eof():
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the client closed it
                break
            sent = json.loads(await reader.readexactly(int(re.search(rb"Content-Length: (\d+)", head)[1])))
            answer = json.dumps({"echo": sent["n"]}).encode()
            status = b"422 Unprocessable Content" if sent["n"] == 2 else b"200 OK"
            closing = sent["n"] in (1, 3)  # after 3, without saying so
            writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(answer)).encode() + b"\r\n" + b"connection: close\r\n" * (sent["n"] == 1)
                         + b"\r\n" + answer)  # fmt: skip
            await writer.drain()
            if closing:
                break
        writer.close()

    async def exchange():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        client = KeepAlive(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/translate")
        answers = [await client.post({"n": n}) for n in range(5)]
        await client.close()
        server.close()
        return answers

    answers = asyncio.run(exchange())
    assert answers == [(200, {"echo": 0}), (200, {"echo": 1}), (422, {"echo": 2}), (200, {"echo": 3}),
                       (200, {"echo": 4})]  # fmt: skip
    assert len(connections) == 3  # a new one after the server closed each
