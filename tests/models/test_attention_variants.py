"""Attention variants as model config fields: another normaliser (``attention_normaliser``) and local
self-attention (``attention_window``), in every architecture."""

import pytest
import torch

from attnkit.attention.multihead import MultiHeadAttention
from attnkit.config import load_run_config
from attnkit.convert import to_hf_bert, to_hf_gpt2, to_hf_marian
from attnkit.errors import ConfigError, ConversionError
from attnkit.models import DecoderModelConfig, EncoderModelConfig, TransformerConfig, build_model
from attnkit.train.loop import Trainer
from tests.models.test_decoder_only import cached_pass


def test_a_windowed_head_equals_torch_multihead_attention_with_the_band_as_its_mask():
    torch.manual_seed(0)
    ours = MultiHeadAttention(16, 4, window=2).eval()
    theirs = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    theirs.in_proj_weight.data.copy_(ours.in_proj.weight)
    theirs.in_proj_bias.data.copy_(ours.in_proj.bias)
    theirs.out_proj.load_state_dict(ours.out_proj.state_dict())
    x = torch.randn(3, 9, 16)
    i = torch.arange(9)
    hidden = (i[:, None] - i[None, :]).abs() > 2  # torch's convention: True = may not attend
    expected, _ = theirs(x, x, x, attn_mask=hidden)
    torch.testing.assert_close(ours(x)[0], expected, atol=1e-6, rtol=1e-5)
    # the reference path (asked for weights) gives the same, and zero weight outside the band
    out, weights = ours(x, need_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    assert torch.all(weights[..., hidden] == 0)


def _encoder(**fields):
    torch.manual_seed(0)
    config = EncoderModelConfig.from_preset("tiny-encoder", layers=1, **fields)
    return build_model(config, 40).eval()


def test_a_local_encoder_layer_sees_only_its_window():
    model = _encoder(attention_window=2)
    ids = torch.randint(1, 40, (1, 10))
    base = model.encode(ids)[0, 0]
    far, near = ids.clone(), ids.clone()
    far[0, 5] = (ids[0, 5] % 39) + 1  # 5 positions away: outside the window
    near[0, 2] = (ids[0, 2] % 39) + 1  # 2 positions away: inside
    torch.testing.assert_close(model.encode(far)[0, 0], base)
    assert not torch.allclose(model.encode(near)[0, 0], base)
    full = _encoder()
    assert not torch.allclose(full.encode(far)[0, 0], full.encode(ids)[0, 0])  # without a window it would


def test_a_window_as_long_as_the_input_is_full_attention():
    torch.manual_seed(0)
    windowed = _encoder(attention_window=9)
    full = _encoder()
    full.load_state_dict(windowed.state_dict())
    ids = torch.randint(1, 40, (2, 10))
    torch.testing.assert_close(windowed.encode(ids), full.encode(ids))


@pytest.mark.parametrize("normaliser", ["softmax", "relu", "sigmoid"])
def test_a_sliding_window_decoder_with_the_kv_cache_equals_the_full_pass(normaliser):
    torch.manual_seed(0)
    config = DecoderModelConfig.from_preset(
        "tiny-decoder", attention_window=3, attention_normaliser=normaliser, dropout=0.0
    )
    model = build_model(config, 30).eval()
    ids = torch.randint(1, 30, (2, 12))
    with torch.no_grad():
        full = model(ids)
    torch.testing.assert_close(cached_pass(model, ids, prompt=4), full, atol=1e-5, rtol=1e-5)
    changed = ids.clone()
    changed[:, 0] = (ids[:, 0] % 29) + 1
    with torch.no_grad():  # two layers of window 3 reach 6 positions back, no further
        torch.testing.assert_close(model(changed)[:, 7:], full[:, 7:])


@pytest.mark.parametrize("normaliser", ["relu", "gelu", "sigmoid"])
def test_each_normaliser_trains_end_to_end(normaliser, copy_data, tmp_path):
    config = load_run_config(None, [
        "model.preset=tiny", f"model.attention_normaliser={normaliser}", "data.train=[train.src, train.tgt]",
        "data.valid=[valid.src, valid.tgt]", f"data.dir={copy_data}", "data.tokenizer=word",
        "train.max_steps=40", "train.eval_every=40", "train.schedule=constant", "train.warmup=0",
        "train.lr=3e-3", "train.max_tokens=512", "train.eval_metric=loss"])  # fmt: skip
    trainer = Trainer(config, tmp_path / "run", echo=lambda m: None)
    untrained = trainer.validate()["valid_loss"]
    assert trainer.fit()["valid_loss"] < untrained - 0.5
    assert all(
        m.normaliser == normaliser for m in trainer.model.modules() if isinstance(m, MultiHeadAttention)
    )


def test_attention_fields_are_checked_and_exports_refuse_what_hf_cannot_compute():
    with pytest.raises(ConfigError, match=r"model\.attention_normaliser must be one of"):
        TransformerConfig(attention_normaliser="tanh")
    with pytest.raises(ConfigError, match=r"model\.attention_window must be >= 0"):
        DecoderModelConfig(attention_window=-1)
    marian = build_model(TransformerConfig.from_preset("tiny", sinusoid_layout="concatenated",
                                                       attention_window=4), 20)  # fmt: skip
    with pytest.raises(ConversionError, match=r"Marian attends with a softmax over all keys"):
        to_hf_marian(marian)
    with pytest.raises(ConversionError, match=r"GPT-2 attends with a softmax over all keys"):
        to_hf_gpt2(
            build_model(DecoderModelConfig.from_preset("tiny-decoder", attention_normaliser="relu"), 20)
        )
    with pytest.raises(ConversionError, match=r"BERT attends with a softmax"):
        to_hf_bert(build_model(EncoderModelConfig.from_preset("tiny-encoder", attention_window=2), 20))
