"""Behaviour of the whole EncoderDecoder: padding invariance, causality, gradients, determinism, cache."""

import pytest
import torch

from attnkit import TransformerConfig, build_transformer
from attnkit.attention.masks import padding_mask

V = 40


def _model(seed=0, **overrides):
    torch.manual_seed(seed)
    return build_transformer(TransformerConfig.from_preset("tiny", **overrides), V).eval()


def _batch(seed=1, b=3, s=7, t=6):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, V, (b, s), generator=g), torch.randint(1, V, (b, t), generator=g)


@pytest.mark.parametrize("norm_first", [False, True])
def test_source_padding_never_changes_outputs(norm_first):
    model = _model(norm_first=norm_first)
    src, tgt = _batch()
    padded = torch.cat([src, torch.zeros(3, 4, dtype=src.dtype)], dim=1)
    torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)


def test_target_padding_never_changes_the_real_positions():
    model = _model()
    src, tgt = _batch()
    padded = torch.cat([tgt, torch.zeros(3, 3, dtype=tgt.dtype)], dim=1)
    torch.testing.assert_close(model(src, padded)[:, :6], model(src, tgt), atol=1e-5, rtol=1e-5)


def test_changing_future_target_tokens_never_changes_earlier_outputs():
    model = _model()
    src, tgt = _batch()
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] + 7) % (V - 1) + 1
    before, after = model(src, tgt), model(src, changed)
    torch.testing.assert_close(after[:, :4], before[:, :4], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(after[:, 4:], before[:, 4:])


@pytest.mark.parametrize("norm_first", [False, True])
def test_every_parameter_receives_a_gradient(norm_first):
    model = _model(norm_first=norm_first, share_embeddings=False).train()
    src, tgt = _batch()
    logits = model(src, tgt)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten()).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_same_seed_gives_same_weights_and_same_training_mode_outputs():
    src, tgt = _batch()
    outputs = []
    for _ in range(2):
        model = _model(seed=5, dropout=0.3).train()
        torch.manual_seed(9)
        outputs.append(model(src, tgt))
    torch.testing.assert_close(outputs[0], outputs[1], atol=0, rtol=0)
    other = _model(seed=6, dropout=0.3).train()
    torch.manual_seed(9)
    assert not torch.allclose(other(src, tgt), outputs[0])


def test_forward_is_generator_of_decode_of_encode():
    model = _model()
    src, tgt = _batch()
    src_mask = padding_mask(src, 0)
    composed = model.generator(model.decode(model.encode(src, src_mask), src_mask, tgt))
    torch.testing.assert_close(model(src, tgt), composed)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_incremental_decoding_with_cache_equals_recomputing_the_prefix(norm_first, positions):
    model = _model(norm_first=norm_first, positions=positions)
    src, tgt = _batch()
    src[1, 5:] = 0  # a padded source row
    src_mask = padding_mask(src, 0)
    memory = model.encode(src, src_mask)
    full = model.generator(model.decode(memory, src_mask, tgt))
    cache = model.new_cache()
    steps = [
        model.generator(model.decode(memory, src_mask, tgt[:, t : t + 1], cache=cache)) for t in range(6)
    ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert len(cache) == 6


def test_reordered_cache_continues_as_if_the_reordered_batch_had_been_decoded():
    model = _model()
    src, tgt = _batch()
    src_mask = padding_mask(src, 0)
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    model.decode(memory, src_mask, tgt[:, :3], cache=cache)
    order = torch.tensor([2, 0, 0])
    cache.reorder(order)
    continued = model.decode(memory[order], src_mask[order], tgt[order, 3:4], cache=cache)
    fresh = model.decode(memory[order], src_mask[order], tgt[order, :4])[:, 3:4]
    torch.testing.assert_close(continued, fresh, atol=1e-5, rtol=1e-5)


def test_pre_ln_stacks_end_in_a_layer_norm_and_post_ln_stacks_do_not():
    assert isinstance(_model(norm_first=True).encoder.norm, torch.nn.LayerNorm)
    assert isinstance(_model(norm_first=False).decoder.norm, torch.nn.Identity)


def test_bert_style_embeddings_layer_normalise_the_unscaled_sum_and_are_not_exported():
    from attnkit.convert import to_hf_marian
    from attnkit.errors import ConversionError

    model = _model(scale_embeddings=False, embedding_norm=True, positions="learned")
    src, tgt = _batch()
    seen = {}
    model.encoder.register_forward_pre_hook(lambda _, args: seen.__setitem__("src", args[0]))
    model.decoder.register_forward_pre_hook(lambda _, args: seen.__setitem__("tgt", args[0]))
    with torch.no_grad():
        model(src, tgt)
    sides = [(src, model.src_embed.lut, model.src_pos, model.src_norm, "src"),
             (tgt, model.tgt_embed.lut, model.tgt_pos, model.tgt_norm, "tgt")]  # fmt: skip
    for ids, lut, pos, norm, key in sides:
        # BERT: LayerNorm(token + position), no ×√d_model
        expected = torch.nn.functional.layer_norm(
            lut.weight[ids] + pos.weight[: ids.size(1)], (32,), norm.norm.weight, norm.norm.bias, 1e-5
        )
        torch.testing.assert_close(seen[key], expected)
    with pytest.raises(ConversionError, match=r"Marian scales embeddings by √d_model .* embedding_norm=True"):
        to_hf_marian(build_transformer(TransformerConfig.from_preset("tiny", sinusoid_layout="concatenated",
                                                                     embedding_norm=True), V))  # fmt: skip
