"""The encoder on packed rows (cpu/packing.py): the real tokens of a padded batch as the rows of one
matrix, every position-wise map run on them alone, the same states as torch's encoder."""

import copy

import pytest
import torch

from attnkit.cpu import speed_up
from attnkit.cpu.linear import padded_rows
from attnkit.cpu.packing import PackedEncoder, Packing
from tests.nn.test_layers_vs_torch import D, _encoder_stacks


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_skips_padding_and_equals_torch_on_real_tokens(norm_first):
    """``valid`` runs every position-wise map (Q/K/V and output projections, FFN) on the real tokens'
    rows only; torch's encoder (which may skip padding too, with nested tensors) gives the same states
    for the real tokens, forward and backward, and padded positions come out as zeros."""
    ours, peer = _encoder_stacks(norm_first, 3)
    plain = copy.deepcopy(ours)
    assert speed_up(ours).encoders == 1 and isinstance(ours, PackedEncoder)
    rows_seen = []
    for mine in ours.layers:
        for part in (mine.self_attn.in_proj, mine.self_attn.out_proj, mine.feed_forward):
            part.register_forward_hook(lambda m, args, out: rows_seen.append(args[0].size(0)))
    x = torch.randn(4, 30, D, requires_grad=True)
    valid = torch.ones(4, 30, dtype=torch.bool)
    valid[1, 25:], valid[3, 11:] = False, False  # 30 + 25 + 30 + 11 = 96 real tokens of 120
    out = ours(x, valid.unsqueeze(-2), valid=valid)
    # packed as 96 rows (a size the oneDNN maps take as it is): never the 120 of the padded batch
    assert rows_seen == [padded_rows(96)] * 6 and padded_rows(96) == 96
    assert (out[~valid] == 0).all()
    with torch.no_grad():
        ref = peer(x, src_key_padding_mask=~valid)
    torch.testing.assert_close(out[valid], ref[valid], atol=1e-5, rtol=1e-5)
    out[valid].sum().backward()
    grad = x.grad.clone()
    x.grad = None
    plain(x, valid.unsqueeze(-2))[valid].sum().backward()  # the paper's stack, every position: the same
    torch.testing.assert_close(grad, x.grad, atol=1e-5, rtol=1e-5)


def test_packing_rounds_rows_up_with_copies_that_get_no_gradient():
    """101 real tokens pack as 102 rows (oneDNN's next row size); unpacking puts each real token back in
    its place with zeros at padding, and the extra row changes no output and receives no gradient."""
    valid = torch.zeros(3, 40, dtype=torch.bool)
    valid[0, :40], valid[1, :40], valid[2, :21] = True, True, True  # 101 real tokens
    packing = Packing(valid)
    x = torch.randn(3, 40, 5, requires_grad=True)
    rows = packing.pack(x)
    assert rows.shape == (102, 5) and padded_rows(101) == 102
    torch.testing.assert_close(rows[:101], x[valid])
    back = packing.unpack(rows * 2)
    torch.testing.assert_close(back, torch.where(valid[..., None], 2 * x, 0.0))
    back.sum().backward()
    torch.testing.assert_close(x.grad, torch.where(valid[..., None], 2.0, 0.0).expand_as(x))
    with pytest.raises(ValueError, match="without real tokens"):
        Packing(torch.zeros(2, 3, dtype=torch.bool))
