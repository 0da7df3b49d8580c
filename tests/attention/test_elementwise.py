"""An elementwise function's result for a row is the same bits wherever the row falls in its batch
(``elementwise_alike``, attnkit.attention.invariance): a vectorised CPU kernel rounds the entries of its
scalar tail otherwise (on AVX2, a sigmoid's by one unit in the last place for some), which made a
pointer-generator's probabilities depend on the batch."""

from __future__ import annotations

import pytest
import torch

from attnkit.attention.invariance import ONE_THREAD, elementwise_alike

FUNCTIONS = {"sigmoid": (torch.sigmoid, 0.0), "log": (torch.log, 1.0), "exp": (torch.exp, 0.0),
             "tanh": (torch.tanh, 0.0)}  # fmt: skip


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("width", [1, 13, 70, 2000])
def test_a_rows_result_is_the_same_bits_alone_and_at_any_place_in_a_batch(name, width):
    function, fill = FUNCTIONS[name]
    x = torch.randn(40, width, generator=torch.Generator().manual_seed(width)) * 4
    if name == "log":
        x = x.abs() + 1e-3
    with torch.no_grad():
        batched = elementwise_alike(function, x, fill)
        for i in range(40):
            alone = elementwise_alike(function, x[i : i + 1], fill)
            assert torch.equal(alone[0], batched[i]), (name, width, i)
        for rows in (3, 17, 40):  # and among other batchmates
            assert torch.equal(elementwise_alike(function, x[-rows:], fill), batched[-rows:])
    torch.testing.assert_close(batched, function(x), rtol=1e-6, atol=0)  # the function, to its rounding


def test_a_batch_larger_than_a_threads_share_is_taken_in_pieces_alike():
    """Rows past what one thread takes (torch splits larger tensors among its threads, anywhere) go in
    pieces of one thread's size: each row's bits as alone, in a (B, T, 1) tensor as a switch's."""
    x = torch.randn(3 * ONE_THREAD // 64 + 5, 2, 1, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        batched = elementwise_alike(torch.sigmoid, x, 0.0)
        for i in (0, ONE_THREAD // 64, x.size(0) - 1):
            assert torch.equal(elementwise_alike(torch.sigmoid, x[i : i + 1], 0.0)[0], batched[i])
    assert batched.shape == x.shape


def test_with_gradients_it_is_the_function_itself():
    x = torch.randn(5, 3, requires_grad=True)
    y = elementwise_alike(torch.sigmoid, x)
    y.sum().backward()
    assert torch.equal(y, torch.sigmoid(x)) and x.grad is not None
