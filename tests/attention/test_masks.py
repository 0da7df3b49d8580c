"""Masks follow one convention (True = may attend) and convert correctly at the boundaries."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from attnkit.attention import masks


def test_subsequent_mask_matches_the_annotated_transformer_definition():
    size = 6
    annotated = torch.triu(torch.ones(1, size, size), diagonal=1) == 0  # its "mask == 0 is hidden" form
    assert torch.equal(masks.subsequent_mask(size), annotated)


def test_causal_mask_with_cached_prefix_lets_last_queries_see_everything_before_them():
    m = masks.causal_mask(2, 5)
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expected)


def test_padding_mask_hides_pad_keys_for_every_query():
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 8, 0]])
    m = masks.padding_mask(ids, pad_id=0)
    assert m.shape == (2, 1, 4)
    assert m.tolist() == [[[True, True, False, False]], [[True, False, True, False]]]


@given(t_q=st.integers(1, 8), extra=st.integers(0, 4), window=st.integers(0, 5), causal=st.booleans())
def test_local_window_mask_equals_its_definition(t_q, extra, window, causal):
    t_k = t_q + extra
    m = masks.local_window_mask(t_q, t_k, window=window, causal=causal)
    for i in range(t_q):
        pos = t_k - t_q + i
        for j in range(t_k):
            allowed = (0 <= pos - j <= window) if causal else abs(pos - j) <= window
            assert m[i, j].item() == allowed


def test_combine_masks_is_logical_and_and_ignores_none():
    a = masks.causal_mask(3)
    b = masks.padding_mask(torch.tensor([[1, 1, 0]]), 0)
    assert masks.combine_masks(None, None) is None
    assert torch.equal(masks.combine_masks(a, None), a)
    assert torch.equal(masks.combine_masks(a, b), a & b)


def test_target_mask_is_padding_and_causal():
    tgt = torch.tensor([[3, 4, 0]])
    expected = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 1, 0]]], dtype=torch.bool)
    assert torch.equal(masks.target_mask(tgt, 0), expected)


def test_conversions_to_and_from_other_libraries_conventions():
    keep = torch.tensor([[True, False, True]])
    assert torch.equal(masks.to_torch_attn_mask(keep), ~keep)
    torch_padding = torch.tensor([[False, True, False]])  # PyTorch: True = padding
    assert torch.equal(masks.from_key_padding_mask(torch_padding), keep.unsqueeze(-2))
    hf = torch.tensor([[1, 0, 1]])  # HF: 1 = keep
    assert torch.equal(masks.from_hf_attention_mask(hf), keep.unsqueeze(-2))
