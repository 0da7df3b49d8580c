"""Presets have the paper's sizes; bad configs fail with errors that name the field."""

import pytest
import torch

from attnkit import ConfigError, TransformerConfig, build_transformer
from attnkit.models import PRESETS, build_model, from_preset


def _parameters(preset, vocab=37000):
    with torch.device("meta"):  # count without allocating 200M floats
        model = build_transformer(preset, vocab)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("preset", "paper_count"), [("paper-base", 65e6), ("paper-big", 213e6)])
def test_paper_presets_have_the_papers_parameter_counts_within_3_percent(preset, paper_count):
    assert abs(_parameters(preset) - paper_count) / paper_count < 0.03


def test_paper_presets_have_table_3_hyper_parameters():
    base, big = TransformerConfig.from_preset("paper-base"), TransformerConfig.from_preset("paper-big")
    assert (base.encoder_layers, base.d_model, base.d_ff, base.h, base.dropout) == (6, 512, 2048, 8, 0.1)
    assert (big.encoder_layers, big.d_model, big.d_ff, big.h, big.dropout) == (6, 1024, 4096, 16, 0.3)
    assert base.d_k == 64 and big.d_k == 64
    assert (
        not base.norm_first and base.share_embeddings and base.tie_output and base.positions == "sinusoidal"
    )


def test_every_preset_of_every_architecture_builds_and_overrides_apply():
    for name, config_class in PRESETS.items():
        config = from_preset(name)
        assert isinstance(config, config_class) and config.arch == config_class.ARCH
        if config.arch in ("glimpse", "whole-image"):  # images in, one label per image out
            small = build_model(from_preset(name, d_hidden=32, image_size=24), None)
            assert small(torch.rand(2, 1, 24, 24)).shape == (2, 10)
            continue
        if config.arch in ("show-attend-tell", "caption-transformer"):  # images and the caption so far in
            width = {"d_hidden": 32} if config.arch == "show-attend-tell" else {"d_model": 32, "d_ff": 64}
            small = build_model(from_preset(name, **width, channels=8, image_size=24), 40)
            assert small(torch.rand(2, 1, 24, 24), torch.ones(2, 3, dtype=torch.long)).shape == (2, 3, 40)
            continue
        if (
            config.arch == "listen-attend-spell"
        ):  # frames and the transcript so far in, a character a step out
            small = build_model(from_preset(name, d_embed=16, d_hidden=32, n_mels=8), 40)
            assert small(torch.randn(2, 30, 8), torch.ones(2, 3, dtype=torch.long)).shape == (2, 3, 40)
            continue
        shape = (
            {"d_embed": 16, "d_hidden": 32} if config.arch == "rnn" else {"d_model": 32, "d_ff": 64, "h": 4}
        )
        small = build_model(from_preset(name, **shape), 40)
        seq2seq = config.arch in ("encoder-decoder", "rnn")
        inputs = [torch.ones(1, 3, dtype=torch.long)] * (2 if seq2seq else 1)
        width = 32 if config.arch == "encoder" else 40  # an encoder without a head: hidden states
        assert small(*inputs).shape == (1, 3, width)
    assert TransformerConfig.from_preset("small", dropout=0.3).dropout == 0.3


def test_unknown_preset_and_unknown_field_are_named():
    with pytest.raises(ConfigError, match="unknown encoder-decoder preset 'paper-huge'"):
        TransformerConfig.from_preset("paper-huge")
    with pytest.raises(ConfigError, match="unknown preset 'paper-huge'; choose one of"):
        from_preset("paper-huge")
    with pytest.raises(ConfigError, match=r"my.yaml: unknown model field\(s\) \['d_modle'\]"):
        TransformerConfig.from_dict({"d_modle": 512}, source="my.yaml")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("h", 7, "divisible by model.h"),
        ("dropout", 1.5, r"model.dropout must be in \[0, 1\)"),
        ("activation", "swish", "model.activation must be one of"),
        ("d_model", 0, "model.d_model must be a positive integer"),
        ("positions", "rotary", "model.positions must be one of"),
    ],
)
def test_bad_values_are_config_errors_naming_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        TransformerConfig(**{field: value})


def test_shared_embeddings_need_one_vocabulary_but_separate_ones_work():
    with pytest.raises(ConfigError, match="src_vocab=10 and tgt_vocab=12"):
        build_transformer("tiny", 10, 12)
    model = build_transformer(TransformerConfig.from_preset("tiny", share_embeddings=False), 10, 12)
    assert model(torch.randint(1, 10, (2, 3)), torch.randint(1, 12, (2, 4))).shape == (2, 4, 12)
    assert model.generator.proj.weight is model.tgt_embed.lut.weight
    assert model.tgt_embed is not model.src_embed


def test_shared_vocabulary_ties_source_target_and_output_into_one_matrix():
    model = build_transformer("tiny", 30)
    weight = model.src_embed.lut.weight
    assert model.tgt_embed.lut.weight is weight and model.generator.proj.weight is weight
    names = [name for name, _ in model.named_parameters()]
    assert sum("lut" in n or "generator" in n for n in names) == 1
