"""RowBuffers: a running batch's per-source tensors joined and kept as concatenation and
``index_select`` give them, without copying the running rows at a join."""

import torch
import torch.nn.functional as F

from attnkit import TransformerConfig, build_transformer
from attnkit.decode.search import staying
from attnkit.models.row_buffers import RowBuffers


def _padded_cat(mine: torch.Tensor, theirs: torch.Tensor, dim: int, fill: float) -> torch.Tensor:
    """The reference: both padded after their entries along ``dim`` to the wider, then concatenated."""
    width = max(mine.size(dim), theirs.size(dim))

    def padded(x: torch.Tensor) -> torch.Tensor:
        widths = [0, 0] * (x.dim() - 1 - dim) + [0, width - x.size(dim)]  # F.pad counts from the last dim
        return F.pad(x, widths, value=fill)

    return torch.cat([padded(mine), padded(theirs)])


def test_joins_and_keeps_in_any_order_give_what_concatenation_and_index_select_give():
    g = torch.Generator().manual_seed(0)
    buffers = RowBuffers()
    mine = torch.randn(3, 2, 5, 4, generator=g)  # (N, h, S, d_k), S along dim 2
    reference = mine.clone()
    for turn in range(40):
        if turn % 3 == 2 and len(reference) > 1:
            ended = (torch.rand(len(reference), generator=g) < 0.3).tolist()
            if all(ended):
                ended[0] = False
            if turn % 2:  # the order search keeps rows in (the last fill the places left): in place
                index = torch.tensor(staying(ended))
            else:  # any other order: gathered into the pair's other buffer
                index = torch.tensor([i for i, gone in enumerate(ended) if not gone]).flip(0)
            mine, reference = buffers.kept("key", mine, index), reference.index_select(0, index)
        else:
            width = int(torch.randint(2, 9, (1,), generator=g))  # sometimes wider than the running rows
            theirs = torch.randn(int(torch.randint(1, 4, (1,), generator=g)), 2, width, 4, generator=g)
            reference = _padded_cat(reference, theirs, 2, -1.0)
            mine = buffers.joined("key", mine, theirs, 2, -1.0)
        assert torch.equal(mine, reference), f"turn {turn}"
        assert mine.is_contiguous()


def test_a_join_writes_the_newcomers_behind_the_running_rows_without_copying_them():
    buffers = RowBuffers()
    ids = buffers.joined("src", torch.tensor([[5, 6, 2]]), torch.tensor([[7, 2]]), 1, 0)  # room made here
    running = ids.clone()
    joined = buffers.joined("src", ids, torch.tensor([[8, 9, 2], [4, 2, 0]]), 1, 0)
    assert joined.data_ptr() == ids.data_ptr()  # the same storage: the running rows stay where they were
    assert torch.equal(joined[:2], running)
    assert joined.tolist() == [[5, 6, 2], [7, 2, 0], [8, 9, 2], [4, 2, 0]]
    kept = buffers.kept("src", joined, torch.tensor([1, 3]))  # into the pair's other buffer
    assert kept.data_ptr() != joined.data_ptr() and kept.tolist() == [[7, 2, 0], [4, 2, 0]]
    assert buffers.joined("src", kept, torch.tensor([[3, 2]]), 1, 0).data_ptr() == kept.data_ptr()


def test_rows_that_stay_keep_their_places_and_the_last_ones_fill_the_places_left():
    # rows 1 and 4 end: row 5, the last that goes on, takes row 1's place; 0, 2 and 3 stay where they are
    assert staying([False, True, False, False, True, False]) == [0, 5, 2, 3]
    assert staying([True, True, False]) == [2]
    assert staying([False, False]) == [0, 1] and staying([True]) == []


def test_rows_kept_in_search_order_copy_only_the_moved_ones_in_place():
    buffers = RowBuffers()
    ids = buffers.joined("src", torch.tensor([[1, 2]]), torch.tensor([[3, 4], [5, 6], [7, 8], [9, 10]]), 1, 0)
    kept = buffers.kept("src", ids, torch.tensor(staying([False, True, False, True, False])))
    assert kept.data_ptr() == ids.data_ptr()  # in place: rows 0 and 2 were not copied
    assert kept.tolist() == [[1, 2], [9, 10], [5, 6]]


def test_sources_that_join_a_running_decoding_leave_its_sources_cross_attention_in_place():
    torch.manual_seed(0)
    model = build_transformer(TransformerConfig.from_preset("tiny"), 40).eval()
    g = torch.Generator().manual_seed(1)
    decodings = []
    with torch.no_grad():
        for width in (7, 5, 6):
            decoding = model.decoding(torch.randint(4, 40, (2, width), generator=g), True)
            decoding.next_logits(torch.full((2, 1), 1))  # the first step computes the cross-attention's keys
            decodings.append(decoding)
        running, second, third = decodings
        keys = [third.cache.layers[0].src_attn.key, second.cache.layers[0].src_attn.key]
        expected = _padded_cat(running.cache.layers[0].src_attn.key, keys[1], 2, 0.0)
        running.merge(second)
        before = running.cache.layers[0].src_attn.key
        running.merge(third)
        after = running.cache.layers[0].src_attn.key
    assert after.data_ptr() == before.data_ptr()  # the running sources' keys were not copied
    assert torch.equal(after, _padded_cat(expected, keys[0], 2, 0.0))
