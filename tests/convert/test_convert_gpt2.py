"""DecoderModel equals HF GPT2LMHeadModel (random weights, no download) after conversion, both ways."""

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="HF transformers is the parity reference")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from attnkit.convert import from_hf_gpt2, hf_gpt2_config_kwargs, to_hf_gpt2  # noqa: E402
from attnkit.data.tokenizer import SpecialIds  # noqa: E402
from attnkit.decode.search import argmax, extend  # noqa: E402
from attnkit.errors import ConversionError  # noqa: E402
from attnkit.models import DecoderModel, build_model, from_preset  # noqa: E402

V = 50
END = V - 1  # GPT-2's <|endoftext|>: start, end and padding at once


def _gpt2(seed=0, **overrides):
    torch.manual_seed(seed)
    settings = dict(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=END,
                    eos_token_id=END, attn_implementation="eager")  # fmt: skip
    config = GPT2Config(**{**settings, **overrides})
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.normal_(0, 0.2)  # zero biases and unit norms by default: real values test their mapping
    return model, config


def _left_padded_batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, END, (3, 9), generator=g)
    valid = torch.ones_like(ids, dtype=torch.bool)
    for row, length in enumerate([9, 6, 3]):
        valid[row, : 9 - length] = False
        ids[row, : 9 - length] = END
    positions = (valid.cumsum(-1) - 1).clamp(min=0)
    return ids, valid, positions


def _hf_log_probs(model, ids, valid, positions):
    return model(input_ids=ids, attention_mask=valid.long(), position_ids=positions).logits.log_softmax(-1)


@pytest.mark.parametrize(("activation", "tie"), [("gelu_new", True), ("gelu", True), ("gelu_new", False)])
def test_converted_gpt2_gives_the_same_log_probabilities(activation, tie):
    hf, config = _gpt2(activation_function=activation, tie_word_embeddings=tie)
    ours = from_hf_gpt2(hf.state_dict(), config).eval()
    assert isinstance(ours, DecoderModel) and (ours.generator.proj.weight is ours.embed.lut.weight) == tie
    ids, valid, positions = _left_padded_batch()
    with torch.no_grad():
        expected = _hf_log_probs(hf, ids, valid, positions)
        got = ours(ids, valid, positions).log_softmax(-1)
    torch.testing.assert_close(got[valid], expected[valid], atol=1e-4, rtol=1e-4)  # padding is not output


def test_export_to_gpt2_loads_strictly_and_gives_the_same_log_probabilities():
    hf, config = _gpt2(seed=1)
    ours = from_hf_gpt2(hf.state_dict(), config).eval()
    back = GPT2LMHeadModel(GPT2Config(**hf_gpt2_config_kwargs(ours), attn_implementation="eager")).eval()
    back.load_state_dict(to_hf_gpt2(ours), strict=True)
    ids, valid, positions = _left_padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(
            _hf_log_probs(back, ids, valid, positions)[valid], _hf_log_probs(hf, ids, valid, positions)[valid]
        )


def test_a_model_trained_in_attnkit_exports_to_gpt2():
    torch.manual_seed(2)
    ours = build_model(from_preset("tiny-decoder", dropout=0.1), V).eval()
    hf = GPT2LMHeadModel(GPT2Config(**hf_gpt2_config_kwargs(ours), attn_implementation="eager")).eval()
    hf.load_state_dict(to_hf_gpt2(ours), strict=True)
    ids = torch.randint(0, V, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(input_ids=ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"scale_attn_by_inverse_layer_idx": True}, "scaled by 1/√d_k"),
        ({"activation_function": "silu"}, "activation_function 'silu'"),
        ({"add_cross_attention": True}, "cross-attention"),
    ],
)
def test_gpt2_variants_we_cannot_represent_are_refused(overrides, message):
    hf, config = _gpt2(**overrides)
    with pytest.raises(ConversionError, match=message):
        from_hf_gpt2(hf.state_dict(), config)


def test_cached_greedy_generation_equals_hf_generate_on_left_padded_prompts():
    hf, config = _gpt2(seed=4)
    ours = from_hf_gpt2(hf.state_dict(), config).eval()
    ids, valid, _ = _left_padded_batch()
    new_tokens = 12
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, attention_mask=valid.long(), do_sample=False, num_beams=1,
                             max_new_tokens=new_tokens, pad_token_id=END, eos_token_id=END)  # fmt: skip
        limits = torch.full((3,), new_tokens + 1)  # new_tokens, then </s> ends a row that has not ended
        specials = SpecialIds(pad=END, unk=0, bos=END, eos=END)
        mine = extend(ours.decoding(valid), ids, limits, specials, argmax)
    expected = [row[: row.index(END)] if END in row else row for row in theirs[:, ids.size(1) :].tolist()]
    assert mine == expected
    assert all(len(row) > 3 for row in expected)


def test_the_gpt2_preset_has_gpt2_smalls_parameter_count():
    with torch.device("meta"):
        ours = build_model(from_preset("gpt2"), 50257)
        theirs = GPT2LMHeadModel(GPT2Config())
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters()) == 124_439_808
