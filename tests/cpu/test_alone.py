"""Attention in which each row gets what it would get alone (attnkit.cpu.alone): the same bits
whatever its batchmates, their lengths, their order and the threads, and the attention of eq. 1
(against float64)."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.cpu.alone import MEMORY, PADDED, PAST, attend_as_alone

h, d_k = 4, 16


def _row(t_q: int, length: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, h, t, d_k, generator=g) for t in (t_q, length, length))


def _batch(rows: list[tuple[torch.Tensor, ...]], t_q: int) -> tuple[torch.Tensor, ...]:
    """The rows padded on the right to the longest (+3): queries, keys, values and the key mask."""
    longest = max(k.size(-2) for _, k, _ in rows) + 3
    Q = torch.cat(
        [
            q if q.size(-2) == t_q else torch.nn.functional.pad(q, (0, 0, 0, t_q - q.size(-2)))
            for q, _, _ in rows
        ]
    )
    K, V = (
        torch.cat([torch.nn.functional.pad(x[i], (0, 0, 0, longest - x[i].size(-2))) for x in rows])
        for i in (1, 2)
    )
    mask = torch.zeros(len(rows), 1, 1, longest, dtype=torch.bool)
    for r, (_, k, _) in enumerate(rows):
        mask[r, ..., : k.size(-2)] = True
    return Q, K, V, mask


@pytest.mark.parametrize("t_q", [1, 3, 5, 12])  # beams sharing a memory; torch blocks 3 by the batch
@pytest.mark.parametrize("order", ["sorted", "shuffled"])
def test_each_row_is_the_same_bits_alone_and_among_other_lengths(t_q, order):
    lengths = [3, 3, 7, 8, 9, 15, 16, 17, 30, 64]
    if order == "shuffled":
        lengths = [16, 3, 30, 9, 3, 64, 7, 17, 8, 15]
    rows = [_row(t_q, n, seed) for seed, n in enumerate(lengths)]
    alone = [attend_as_alone(q, k, v, torch.ones(1, 1, 1, k.size(-2), dtype=torch.bool), None, MEMORY)
             for q, k, v in rows]  # fmt: skip
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2, 4):
            torch.set_num_threads(n_threads)
            for take in (slice(0, 2), slice(0, 10), slice(4, 10)):
                Q, K, V, mask = _batch(rows[take], t_q)
                out = attend_as_alone(Q, K, V, mask, None, MEMORY)
                for r, expected in enumerate(alone[take]):
                    assert torch.equal(out[r : r + 1], expected), (n_threads, take, r)
    finally:
        torch.set_num_threads(threads)


def test_self_attention_over_padded_positions_keeps_each_rows_queries():
    """An encoder's self-attention: queries are the keys' positions, cut with them."""
    rows = [_row(n, n, seed) for seed, n in enumerate([2, 9, 13, 5])]
    longest = 16
    Q, K, V, mask = _batch(rows, longest)
    K, V, mask = K[..., :longest, :], V[..., :longest, :], mask[..., :longest]
    out = attend_as_alone(Q, K, V, mask, None, PADDED)
    for r, (q, k, v) in enumerate(rows):
        alone = attend_as_alone(q, k, v, torch.ones(1, 1, 1, k.size(-2), dtype=torch.bool), None, PADDED)
        assert torch.equal(out[r : r + 1, :, : q.size(-2)], alone)


def test_it_is_equation_1():
    q, k, v = _row(3, 11, 0)
    mask = torch.ones(1, 1, 1, 11, dtype=torch.bool)
    mask[..., 9:] = False
    got = attend_as_alone(q, k, v, mask, None, MEMORY)
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d_k)
    expected = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v.double()
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
    assert attend_as_alone(q, k, v, mask, 1.0, MEMORY).ne(got).any()  # the "dot" score's scale


def test_masks_it_cannot_keep_fixed_are_left_to_the_caller():
    q, k, v = _row(1, 6, 0)
    left_padded = torch.tensor([[[[False, False, True, True, True, True]]]])
    per_query = torch.ones(1, 1, 3, 6, dtype=torch.bool)
    assert attend_as_alone(q, k, v, left_padded, None, MEMORY) is None
    assert attend_as_alone(q.expand(1, h, 3, d_k), k, v, per_query, None, MEMORY) is None


def test_a_decoders_past_padded_on_the_left_is_each_rows_own_keys():
    """Continuous batching's rows started at other steps: their past is padded on the left, and each
    row attends as it does alone, where its past has no padding and no mask."""
    lengths = [12, 12, 9, 5, 5, 1]  # joined at later and later steps
    rows = [_row(1, n, seed) for seed, n in enumerate(lengths)]
    longest = max(lengths)
    Q = torch.cat([q for q, _, _ in rows])
    K, V = (
        torch.cat([torch.nn.functional.pad(x[i], (0, 0, longest - x[i].size(-2), 0)) for x in rows])
        for i in (1, 2)
    )
    mask = torch.zeros(len(rows), 1, 1, longest, dtype=torch.bool)
    for r, n in enumerate(lengths):
        mask[r, ..., longest - n :] = True
    out = attend_as_alone(Q, K, V, mask, None, PAST)
    for r, (q, k, v) in enumerate(rows):
        assert torch.equal(out[r : r + 1], attend_as_alone(q, k, v, None, None, PAST)), r
    shuffled = [3, 0, 5, 2, 1, 4]
    out = attend_as_alone(Q[shuffled], K[shuffled], V[shuffled], mask[shuffled], None, PAST)
    assert torch.equal(out, attend_as_alone(Q, K, V, mask, None, PAST)[shuffled])


def test_the_groups_found_once_for_a_mask_follow_its_changes_and_serve_its_views():
    """A memory's groups are found once per mask (a decoding step after step): a view of the same mask
    gets them again, and a mask changed in place, or another mask, gets its own."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(4, 2, 1, 8, generator=g),
        torch.randn(4, 2, 24, 8, generator=g),
        torch.randn(4, 2, 24, 8, generator=g),
    )
    mask = torch.zeros(4, 1, 24, dtype=torch.bool)  # (B, 1, T_k), as a decoding holds it
    for row, length in enumerate((3, 20, 9, 24)):
        mask[row, :, :length] = True

    def expected(m):
        return torch.cat([attend_as_alone(q[i : i + 1], k[i : i + 1], v[i : i + 1], m[i : i + 1, None], None,
                                          MEMORY) for i in range(4)])  # fmt: skip

    first = attend_as_alone(q, k, v, mask.unsqueeze(1), None, MEMORY)
    assert torch.equal(first, expected(mask))
    assert torch.equal(attend_as_alone(q, k, v, mask.unsqueeze(1), None, MEMORY), first)  # another view
    mask[0, :, 3:12] = True  # row 0 now has 12 real keys
    changed = attend_as_alone(q, k, v, mask.unsqueeze(1), None, MEMORY)
    assert torch.equal(changed, expected(mask)) and not torch.equal(changed[0], first[0])
    other = mask.clone()
    other[1, :, 5:] = False
    assert torch.equal(attend_as_alone(q, k, v, other.unsqueeze(1), None, MEMORY), expected(other))


def test_masks_made_under_inference_mode_are_attended_as_alone_too():
    """``torch.inference_mode`` makes tensors without a version counter (the groups' cache keys on it)."""
    q, k, v = torch.randn(3, 2, 1, 8), torch.randn(3, 2, 16, 8), torch.randn(3, 2, 16, 8)
    with torch.inference_mode():
        mask = torch.arange(16)[None, None, None, :] < torch.tensor([4, 16, 9])[:, None, None, None]
        out = attend_as_alone(q, k, v, mask, None, MEMORY)
        alone = [attend_as_alone(q[i : i + 1], k[i : i + 1], v[i : i + 1], mask[i : i + 1], None, MEMORY)
                 for i in range(3)]  # fmt: skip
    assert torch.equal(out, torch.cat(alone))
