"""Embeddings are scaled by √d_model; positional encodings follow the paper's formula (§3.5)."""

import math

import pytest
import torch

from attnkit.nn import Embeddings, LearnedPositionalEmbedding, PositionalEncoding, sinusoid_table


def test_interleaved_table_is_the_papers_formula():
    d_model = 10
    table = sinusoid_table(50, d_model)
    for pos in (0, 1, 7, 49):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("d_model", [8, 9])
def test_concatenated_table_equals_marians(d_model):
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    theirs = MarianSinusoidalPositionalEmbedding(64, d_model).create_weight()
    torch.testing.assert_close(sinusoid_table(64, d_model, "concatenated"), theirs)


def test_odd_width_interleaved_table_has_sines_at_even_dimensions():
    table = sinusoid_table(5, 7)
    assert table.shape == (5, 7)
    torch.testing.assert_close(table[:, 6], torch.sin(torch.arange(5.0) / 10000 ** (6 / 7)))


def test_positions_relate_linearly_pe_pos_plus_k_is_a_rotation_of_pe_pos():
    """The paper's reason for sinusoids: PE(pos+k) is a linear function of PE(pos)."""
    d_model, k = 16, 3
    table = sinusoid_table(40, d_model).double()
    i = torch.arange(d_model // 2, dtype=torch.float64)
    theta = k / 10000 ** (2 * i / d_model)
    sin, cos = table[:, 0::2], table[:, 1::2]
    shifted_sin = sin * torch.cos(theta) + cos * torch.sin(theta)
    shifted_cos = cos * torch.cos(theta) - sin * torch.sin(theta)
    torch.testing.assert_close(shifted_sin[:-k], sin[k:], atol=1e-6, rtol=0)
    torch.testing.assert_close(shifted_cos[:-k], cos[k:], atol=1e-6, rtol=0)


def test_positional_encoding_adds_rows_from_start_and_grows_past_max_len():
    pe = PositionalEncoding(6, dropout=0.0, max_len=4)
    x = torch.zeros(2, 3, 6)
    torch.testing.assert_close(pe(x, start=5), sinusoid_table(8, 6)[5:8].expand(2, 3, 6))
    assert pe.pe.size(0) >= 8
    assert "pe" not in pe.state_dict()


def test_embeddings_are_scaled_by_sqrt_d_model_and_pad_row_starts_at_zero():
    emb = Embeddings(20, 16, padding_idx=0)
    ids = torch.tensor([[0, 3, 5]])
    torch.testing.assert_close(emb(ids), emb.lut.weight[ids] * 4.0)
    assert (emb.lut.weight[0] == 0).all()


def test_learned_positions_refuse_sequences_longer_than_their_table():
    learned = LearnedPositionalEmbedding(4, dropout=0.0, max_len=3)
    assert learned(torch.zeros(1, 3, 4)).shape == (1, 3, 4)
    with pytest.raises(ValueError, match="position 4"):
        learned(torch.zeros(1, 2, 4), start=2)
