"""The compiled step's self-attention history (cpu/compiled/trace.py, decode/compiled.py), checked
without a compiler: the step as traced, run eagerly, decodes exactly as the model's own step; the
history holds what the model's KV cache would; attention of few queries is attention."""

import copy

import pytest
import torch
import torch.nn.functional as F

from attnkit import build_transformer
from attnkit.attention.multihead import KVCache
from attnkit.cpu import speed_up
from attnkit.cpu.attention import attend_as_sums
from attnkit.cpu.compiled.trace import CachedStep, FirstStep, RankedStep
from attnkit.data.tokenizer import SpecialIds
from attnkit.decode import Search, beam_search, greedy
from attnkit.decode.compiled import CompiledDecoding, History
from attnkit.nn.transformer import DecoderCache

IDS = SpecialIds(pad=0, unk=1, bos=2, eos=3)


@pytest.mark.parametrize("keys", [7, 16, 20])  # padded to 16 inside, none padded, padded to 32
def test_attention_of_few_queries_is_scaled_dot_product_attention(keys):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, keys, 8), torch.randn(2, 3, keys, 6)
    mask = torch.rand(2, 1, 5, keys) > 0.4
    mask[..., 0] = True  # every query sees a key
    for scale in (8**-0.5, 1.0):
        q, k, v = q.double(), k.double(), v.double()
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        found = attend_as_sums(q, k, v, mask, scale)
        assert found.shape == expected.shape
        torch.testing.assert_close(found, expected)
    # keys and values of a narrower dtype are widened to the queries'
    q, k, v = q.float(), k.float(), v.float()
    found = attend_as_sums(q, k.bfloat16(), v.bfloat16(), None, 0.5)
    expected = F.scaled_dot_product_attention(q, k.bfloat16().float(), v.bfloat16().float(), scale=0.5)
    torch.testing.assert_close(found, expected)


def _cache(rows, positions, layers=2, h=2, d_k=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    cache = DecoderCache(layers)
    for layer in cache.layers:
        keys, values = (torch.randn(rows, h, positions, d_k, generator=generator) for _ in range(2))
        layer.self_attn = KVCache(keys, values)
    return cache


def test_the_history_holds_what_the_model_cache_would_after_reordering_and_new_positions():
    eager = _cache(rows=6, positions=3)
    history = History(copy.deepcopy(eager), torch.float32)
    generator = torch.Generator().manual_seed(1)
    rows = 6
    for kept in ([2, 2, 0, 5, 1, 3], [4, 0, 1], [2, 2, 1]):  # beam search's reordering, then dropped rows
        keys = [torch.randn(rows, 2, 1, 4, generator=generator) for _ in eager.layers]
        values = [torch.randn(rows, 2, 1, 4, generator=generator) for _ in eager.layers]
        for layer, key, value in zip(eager.layers, keys, values, strict=True):
            layer.self_attn.append(key, value)
        history.extend(
            torch.stack([position.squeeze(2) for position in keys + values])
        )  # (2 layers, R, h, d_k)
        index = torch.tensor(kept)
        for layer in eager.layers:
            layer.self_attn.reorder(index)
        history.select(index)
        rows = len(kept)
    given = DecoderCache(2)
    history.give_back(given)
    for mine, theirs in zip(given.layers, eager.layers, strict=True):
        assert torch.equal(mine.self_attn.key, theirs.self_attn.key)
        assert torch.equal(mine.self_attn.value, theirs.self_attn.value)
    assert len(history) == 6


def test_a_full_history_grows():
    history = History(_cache(rows=2, positions=40), torch.float32)
    assert history.buffer.shape == (80, 4, 2, 2, 4)  # 80 positions of 2 layers' keys and values
    for _ in range(41):
        history.extend(torch.stack([torch.ones(2, 2, 4)] * 2 + [torch.zeros(2, 2, 4)] * 2))
    assert len(history) == 81 and history.buffer.size(0) == 160
    given = DecoderCache(2)
    history.give_back(given)
    assert given.layers[0].self_attn.key[:, :, 40:].eq(1).all()


@pytest.mark.parametrize("first", [False, True], ids=["eager first step", "traced first step"])
@pytest.mark.parametrize("fast_path", [False, True], ids=["paper's modules", "CPU fast path"])
@pytest.mark.parametrize(
    ("beams", "vocabulary"),
    [(1, 16), (3, 16), (3, 1_700)],
    ids=["greedy", "beam 3", "beam 3 ranked by blocks"],  # (1,700: 26 blocks of 64 and a partial one)
)
def test_the_traced_steps_run_eagerly_decode_as_the_model(fast_path, beams, vocabulary, first):
    """Greedy search's step returns the logits; beam search's ranks them too (RankedStep), by blocks
    of tokens where the vocabulary has enough of them: the same hypotheses as the model's own steps."""
    torch.manual_seed(0)
    model = build_transformer("tiny", vocabulary).eval()
    with torch.no_grad():
        model.generator.proj.weight.mul_(4)  # sharper, more varied distributions than at init
    if fast_path:
        speed_up(model)
    src = torch.randint(4, 16, (5, 7))
    src[1, 4:] = IDS.pad
    src[:, -1] = torch.where(src[:, -1] == IDS.pad, IDS.pad, IDS.eos)
    step = CachedStep(model) if beams == 1 else RankedStep(model, beams)
    taken = []

    def counted(*tensors):
        taken.append(len(tensors))
        return step(*tensors)

    def encoded(*tensors):
        taken.append("first")
        return FirstStep(model)(*tensors)

    def decoding(src, use_cache=True):
        return CompiledDecoding(model, src, use_cache, counted, beams, (encoded, IDS.bos) if first else None)

    search = Search(beam_size=beams, n_best=beams, max_len_a=1.0, max_len_b=6)
    with torch.no_grad():
        if beams == 1:
            assert greedy(model, src, IDS, search, decoding=decoding) == greedy(model, src, IDS, search)
        else:
            found = beam_search(model, src, IDS, search, decoding=decoding)
            expected = beam_search(model, src, IDS, search)
            assert [[h.tokens for h in hs] for hs in found] == [[h.tokens for h in hs] for hs in expected]
            for a, b in zip(found, expected, strict=True):
                assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
    assert len(taken) >= 4  # the traced step took the steps after the first
    assert taken.count("first") == (1 if first else 0)  # one batch: encoded once, by the traced first step


def test_a_first_step_for_another_start_decodes_eagerly():
    """The compiled first step decodes the start token it was made for; other first tokens are decoded
    by the model, on the memory the step computed."""
    torch.manual_seed(0)
    model = build_transformer("tiny", 16).eval()
    src = torch.randint(4, 16, (3, 5))
    decoding = CompiledDecoding(model, src, True, CachedStep(model), 1, (FirstStep(model), IDS.bos))
    other = torch.full((3, 1), 7)
    with torch.no_grad():
        expected = model.decoding(src).next_logits(other)
        torch.testing.assert_close(decoding.next_logits(other), expected)
