"""``attnkit import-hf``: a local HF Marian folder (random weights, written by ``save_pretrained``, no
download) becomes a run directory that ``attnkit translate`` uses, with HF's logits; folders attnkit cannot
translate with are refused in one line that says why. GPT-2 and BERT runs exported back to HF folders keep
HF's logits. (A translation model exported and imported back: test_export.)"""

import json
import re

import pytest
import torch
from typer.testing import CliRunner

from attnkit.cli import app
from attnkit.data.tokenizer import Tokenizer
from attnkit.loading import load_for_inference
from tests.cli.checks import one_line_error

transformers = pytest.importorskip("transformers", reason="HF transformers writes the folders")

TEXTS = ["ein kleiner hund läuft", "zwei männer sitzen auf einer bank", "eine frau liest ein buch"] * 20


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train("bpe", TEXTS, vocab_size=300, min_frequency=1)


def _marian_folder(path, tokenizer, **overrides):
    """A random-weight MarianMTModel saved as HF saves it, with ``tokenizer``'s tokenizer.json."""
    s = tokenizer.specials
    settings = dict(
        vocab_size=tokenizer.vocab_size, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=64, pad_token_id=s.pad, eos_token_id=s.eos, decoder_start_token_id=s.bos,
        forced_eos_token_id=None, scale_embedding=True,
    )  # fmt: skip
    settings.update(overrides)
    torch.manual_seed(0)
    model = transformers.MarianMTModel(transformers.MarianConfig(**settings)).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()  # zero by default: a real bias tests its import
    model.save_pretrained(path)
    (path / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
    return model


def test_an_hf_marian_folder_becomes_a_run_that_translates_with_hfs_logits(tokenizer, tmp_path):
    hf = _marian_folder(tmp_path / "hf", tokenizer)
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["import-hf", str(tmp_path / "hf"), "--out", str(run)])
    assert result.exit_code == 0, result.output
    assert "attnkit translate" in result.output
    ours, loaded_tokenizer, config = load_for_inference(run, overrides=["decode.precision=fp32"])  # as HF's
    assert config.model.arch == "encoder-decoder" and loaded_tokenizer.vocab_size == tokenizer.vocab_size
    src = torch.tensor([[*ids, tokenizer.specials.eos] for ids in tokenizer.encode_batch(TEXTS[:1])])
    tgt = torch.tensor([[tokenizer.specials.bos, 7, 9, 11]])
    with torch.no_grad():
        expected = hf(input_ids=src, decoder_input_ids=tgt).logits
        torch.testing.assert_close(ours(src, tgt), expected, atol=1e-5, rtol=1e-5)
    source = tmp_path / "source.txt"
    source.write_text("\n".join(TEXTS[:3]) + "\n", encoding="utf-8")
    translated = CliRunner().invoke(app, ["translate", "--ckpt", str(run), "--beam", "2", "-i", str(source)])
    assert translated.exit_code == 0, translated.output
    assert len(translated.stdout.splitlines()) == 3


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"decoder_start_token_id": 0}, "starts from id 0 .*search starts from the tokenizer's <s>"),
        ({"decoder_vocab_size": 500, "share_encoder_decoder_embeddings": False}, "separate source and"),
    ],
    ids=["starts-from-pad", "two-vocabularies"],
)  # fmt: skip
def test_marian_folders_attnkit_cannot_translate_with_are_refused_in_one_line(
    tokenizer, tmp_path, overrides, message
):
    _marian_folder(tmp_path / "hf", tokenizer, **overrides)
    result = CliRunner().invoke(app, ["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert re.search(message, result.output), result.output
    assert not (tmp_path / "run").exists()


def test_importing_into_a_run_directory_or_from_a_pickle_only_folder_is_refused(tokenizer, tmp_path):
    _marian_folder(tmp_path / "hf", tokenizer)
    runner = CliRunner()
    assert (
        runner.invoke(app, ["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]).exit_code == 0
    )
    again = runner.invoke(app, ["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")])
    assert again.exit_code == 0, again.output  # the same folder imported again replaces its import
    _marian_folder(tmp_path / "hf2", tokenizer)
    other = runner.invoke(app, ["import-hf", str(tmp_path / "hf2"), "--out", str(tmp_path / "run")])
    assert other.exit_code == 2 and "already holds a run" in other.output
    (tmp_path / "hf" / "model.safetensors").unlink()  # as a folder with only pytorch_model.bin
    missing = runner.invoke(app, ["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run2")])
    assert missing.exit_code == 2 and "missing model.safetensors" in missing.output
    config = json.loads((tmp_path / "hf" / "config.json").read_text(encoding="utf-8"))
    assert config["model_type"] == "marian"


def _gpt2_folder(path, tokenizer, seed):
    """A random-weight GPT2LMHeadModel saved as HF saves it, with ``tokenizer``'s tokenizer.json."""
    s = tokenizer.specials
    settings = dict(vocab_size=tokenizer.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                    bos_token_id=s.bos, eos_token_id=s.eos, pad_token_id=s.pad)  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**settings)).eval()
    model.save_pretrained(path)
    (path / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
    return model


def test_an_hf_gpt2_folder_becomes_a_run_that_generates_as_hf_does(tokenizer, tmp_path):
    """GPT2LMHeadModel (random weights) through import-hf: ``attnkit generate`` greedy = HF ``generate``."""
    s = tokenizer.specials
    hf = _gpt2_folder(tmp_path / "hf", tokenizer, seed=1)
    result = CliRunner().invoke(app, ["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "attnkit generate" in result.output
    prompt = "zwei männer"
    ours = CliRunner().invoke(app, ["generate", "--ckpt", str(tmp_path / "run"), "--prompt", prompt,
                                    "--temperature", "0", "--max-new-tokens", "8"])  # fmt: skip
    assert ours.exit_code == 0, ours.output
    ids = torch.tensor([tokenizer.encode(prompt)])
    with torch.no_grad():
        out = hf.generate(ids, do_sample=False, max_new_tokens=8, bad_words_ids=[[s.pad], [s.bos]])
    generated = [i for i in out[0, ids.size(1) :].tolist() if i != s.eos]
    assert ours.stdout.strip() == (prompt + tokenizer.decode(generated)).strip()


def test_a_gpt2_run_exported_to_hf_gives_hfs_logits_and_tokens(tokenizer, tmp_path):
    """HF GPT-2 (random weights) -> import-hf -> export --to hf -> ``GPT2LMHeadModel.from_pretrained``:
    the logits of the model first saved, and the tokenizer's ids."""
    s = tokenizer.specials
    hf = _gpt2_folder(tmp_path / "hf", tokenizer, seed=2)
    runner = CliRunner()
    assert (
        runner.invoke(app, ["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]).exit_code == 0
    )
    result = runner.invoke(app, ["export", "--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "GPT2LMHeadModel.from_pretrained" in result.output
    exported = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    ids = torch.tensor([tokenizer.encode(TEXTS[1])])
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert hf_tokenizer(TEXTS[1])["input_ids"] == tokenizer.encode(TEXTS[1])
    assert hf_tokenizer.pad_token_id == s.pad and exported.generation_config.eos_token_id == s.eos


def test_a_bert_classifier_keeps_its_label_names_through_import_and_export(tokenizer, tmp_path):
    """HF ``BertForSequenceClassification`` with named labels -> import-hf (predict names them) -> export
    --to hf -> ``from_pretrained``: the same logits and ``id2label``."""
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    settings = dict(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                    pad_token_id=tokenizer.specials.pad, num_labels=3, id2label=labels,
                    label2id={v: k for k, v in labels.items()})  # fmt: skip
    torch.manual_seed(3)
    hf = transformers.BertForSequenceClassification(transformers.BertConfig(**settings)).eval()
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
    runner = CliRunner()
    assert (
        runner.invoke(app, ["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]).exit_code == 0
    )
    predicted = runner.invoke(app, ["predict", "--ckpt", str(tmp_path / "run"), "--text", TEXTS[2]])
    assert predicted.exit_code == 0, predicted.output
    s = tokenizer.specials
    ids = torch.tensor([[s.bos, *tokenizer.encode(TEXTS[2]), s.eos]])  # [CLS] tokens [SEP]
    with torch.no_grad():
        expected = hf(ids).logits
    assert predicted.stdout.split("\t")[0] == labels[int(expected.argmax())]
    result = runner.invoke(app, ["export", "--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0 and "BertForSequenceClassification.from_pretrained" in result.output
    exported = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    assert exported.config.id2label == labels
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, expected, atol=1e-5, rtol=1e-5)


def _bert_folder(path, tokenizer):
    settings = dict(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                    intermediate_size=64, num_attention_heads=4, max_position_embeddings=64,
                    pad_token_id=tokenizer.specials.pad)  # fmt: skip
    torch.manual_seed(4)
    transformers.BertForMaskedLM(transformers.BertConfig(**settings)).save_pretrained(path)
    (path / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")


@pytest.mark.parametrize(
    ("family", "field", "value", "weight"),
    [
        ("marian", "vocab_size", 310, r"(model\.shared\.weight|final_logits_bias|lm_head\.weight) has \d+"),
        ("marian", "decoder_ffn_dim", 48, r"decoder\.layers\.0\.fc1\.(weight|bias) has 64 \(dimension 0"),
        ("gpt2", "vocab_size", 310, r"wte\.weight has \d+ \(dimension 0"),
        ("gpt2", "n_inner", 100, r"h\.0\.mlp\.c_fc\.(weight|bias) has 128 \(dimension [01]"),
        ("gpt2", "n_positions", 80, r"wpe\.weight has 64 \(dimension 0"),
        ("bert", "intermediate_size", 48, r"intermediate\.dense\.(weight|bias) has 64 \(dimension 0"),
        ("bert", "type_vocab_size", 3, r"token_type_embeddings\.weight has 2 \(dimension 0"),
        ("bert", "vocab_size", 310, r"word_embeddings\.weight has \d+ \(dimension 0"),
    ],
)  # fmt: skip
def test_a_config_whose_sizes_the_weights_lack_is_one_line_and_writes_nothing(
    tokenizer, tmp_path, family, field, value, weight
):
    """A size in config.json that the weights do not have: one line naming the file, the field, the
    weight and both sizes, before anything is built (it used to be load_state_dict's long traceback)."""
    folder = tmp_path / "hf"
    {"marian": _marian_folder, "gpt2": lambda p, t: _gpt2_folder(p, t, 0), "bert": _bert_folder}[family](
        folder, tokenizer
    )
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config[field] = value
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    result = CliRunner().invoke(app, ["import-hf", str(folder), "--out", str(tmp_path / "run")])
    one_line_error(result, rf"hf: config\.json's {field} gives {value}, but model\.safetensors's \S*{weight}")
    assert not (tmp_path / "run").exists()
