"""The whole EncoderDecoder equals HF MarianMTModel (random weights, no download) after conversion."""

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="HF transformers is the parity reference")
from transformers import MarianConfig, MarianMTModel  # noqa: E402

from attnkit.convert import from_hf_marian, hf_marian_config_kwargs, to_hf_marian  # noqa: E402
from attnkit.errors import ConversionError  # noqa: E402

V = 60


def _marian(seed=0, **overrides):
    torch.manual_seed(seed)
    settings = dict(
        vocab_size=V,
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="relu",
        scale_embedding=True,
        pad_token_id=0,
        decoder_start_token_id=0,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    settings.update(overrides)
    config = MarianConfig(**settings)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()  # zero by default; a real bias tests its mapping
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model, config


def _inputs(tgt_vocab=V):
    g = torch.Generator().manual_seed(3)
    src = torch.randint(1, V, (3, 11), generator=g)
    src[1, 7:] = 0
    src[2, 3:] = 0
    return src, torch.randint(1, tgt_vocab, (3, 8), generator=g)


def _hf_logits(model, src, tgt):
    return model(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt).logits


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_converted_marian_gives_the_same_logits(activation):
    hf, config = _marian(activation_function=activation)
    ours = from_hf_marian(hf.state_dict(), config).eval()
    src, tgt = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(ours(src, tgt), _hf_logits(hf, src, tgt), atol=1e-4, rtol=1e-4)


def test_marian_with_separate_source_and_target_vocabularies():
    hf, config = _marian(share_encoder_decoder_embeddings=False, decoder_vocab_size=45)
    ours = from_hf_marian(hf.state_dict(), config).eval()
    assert ours.tgt_embed is not ours.src_embed and ours.tgt_vocab == 45
    src, tgt = _inputs(tgt_vocab=45)
    with torch.no_grad():
        torch.testing.assert_close(ours(src, tgt), _hf_logits(hf, src, tgt), atol=1e-4, rtol=1e-4)


def test_round_trip_back_to_marian_loads_strictly_and_matches():
    hf, config = _marian(seed=1)
    ours = from_hf_marian(hf.state_dict(), config).eval()
    back = MarianMTModel(MarianConfig(**hf_marian_config_kwargs(ours), attn_implementation="eager")).eval()
    back.load_state_dict(to_hf_marian(ours), strict=True)
    src, tgt = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(_hf_logits(back, src, tgt), ours(src, tgt), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(_hf_logits(back, src, tgt), _hf_logits(hf, src, tgt), atol=1e-4, rtol=1e-4)


def test_cached_decoding_of_a_converted_model_matches_marian():
    hf, config = _marian(seed=2)
    ours = from_hf_marian(hf.state_dict(), config).eval()
    src, tgt = _inputs()
    src_mask = (src != 0).unsqueeze(1)
    with torch.no_grad():
        memory = ours.encode(src, src_mask)
        cache = ours.new_cache()
        steps = [
            ours.generator(ours.decode(memory, src_mask, tgt[:, t : t + 1], cache=cache)) for t in range(8)
        ]
        torch.testing.assert_close(torch.cat(steps, 1), _hf_logits(hf, src, tgt), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"activation_function": "swish"}, "swish"), ({"scale_embedding": False}, "scale_embedding")],
)
def test_unsupported_marian_variants_are_refused(overrides, message):
    _, config = _marian(**overrides)
    with pytest.raises(ConversionError, match=message):
        from_hf_marian({}, config)


def test_a_state_dict_that_is_not_marians_is_refused_by_name():
    _, config = _marian()
    with pytest.raises(ConversionError, match=r"model\.shared\.weight"):
        from_hf_marian({"encoder.weight": torch.zeros(1)}, config)
