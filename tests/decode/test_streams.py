"""Batches decoded side by side (decode/streams.py): in order, each stream on its share of the threads,
torch's thread count as before afterwards, and the same translations as one batch at a time."""

import dataclasses
import threading

import pytest
import torch

from attnkit import build_transformer
from attnkit.config import DecodeConfig
from attnkit.data.synthetic import copy
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.streams import fill_by_batch, in_streams, stream_count
from attnkit.decode.translate import translate
from attnkit.errors import ConfigError


def test_streams_run_in_order_on_their_share_of_the_threads_and_give_the_count_back(two_threads):
    seen = []

    def work(item: int) -> int:
        seen.append((threading.get_ident(), torch.get_num_threads()))
        return item * item

    assert list(in_streams(work, range(6), 2)) == [0, 1, 4, 9, 16, 25]
    assert {threads for _, threads in seen} == {1}  # two streams share the two threads
    assert threading.get_ident() not in {thread for thread, _ in seen}
    assert torch.get_num_threads() == 2
    seen.clear()
    assert list(in_streams(work, range(3), 1)) == [0, 1, 4]  # one stream: here, on every thread
    assert seen == [(threading.get_ident(), 2)] * 3


def test_each_batchs_results_go_to_its_indices_and_progress_hears_each_batch(two_threads):
    done = []
    batches = [[4, 0], [2], [1, 3]]  # indices of five items, out of order
    filled = fill_by_batch(lambda batch: [10 * i for i in batch], batches, 2, [None] * 5, done.append)
    assert filled == [0, 10, 20, 30, 40] and done == [2, 1, 2]


def test_an_error_in_a_stream_reaches_the_caller_and_the_thread_count_is_restored(two_threads):
    def work(item: int) -> int:
        if item == 2:
            raise ValueError("bad batch 2")
        return item

    with pytest.raises(ValueError, match="bad batch 2"):
        list(in_streams(work, range(5), 2))
    assert torch.get_num_threads() == 2


def test_stream_count(two_threads):
    assert stream_count(0, "cpu", batches=10) == 2  # one per thread
    assert stream_count(0, "cpu", batches=1) == 1  # never more than the batches
    assert stream_count(8, "cpu", batches=10) == 2  # nor than the threads
    assert stream_count(1, "cpu", batches=10) == 1
    assert stream_count(0, "cuda", batches=10) == 1  # a GPU runs one batch at a time
    with pytest.raises(ConfigError, match=r"decode\.streams"):
        DecodeConfig(streams=-1)


@pytest.mark.parametrize("beam", [1, 3])
def test_translations_in_two_streams_are_those_of_one(beam, two_threads):
    tokenizer = Tokenizer.train("word", copy(300, seed=0, max_length=6).src)
    torch.manual_seed(3)  # a random model whose outputs differ from sentence to sentence
    model = build_transformer("tiny", tokenizer.vocab_size).eval()
    texts = copy(40, seed=1, max_length=6).src
    texts[7] = ""  # an empty line stays empty
    one = translate(model, tokenizer, texts, DecodeConfig(batch_size=4, streams=1), beam_size=beam)
    graphs = []  # whether a stream's thread records gradients (gradient mode is per thread): it must not
    hook = model.decoder.register_forward_hook(lambda module, args, out: graphs.append(out.requires_grad))
    two = translate(model, tokenizer, texts, DecodeConfig(batch_size=4, streams=2), beam_size=beam)
    hook.remove()
    assert two == one and one[7] == "" and len(set(one)) > 10
    assert graphs and not any(graphs)
    assert torch.get_num_threads() == 2
    assert dataclasses.asdict(DecodeConfig())["streams"] == 0  # the default: one stream per thread
