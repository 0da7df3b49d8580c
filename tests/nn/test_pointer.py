"""The pointer-generator (``model.copy``): its output is See et al.'s (2017) eq. 9 mixture, recomputed
here in float64 from the formula; it decodes step by step as in one pass; it copies tokens it never
learned to generate; and models with it are refused where a peer cannot copy."""

import math

import pytest
import torch

from attnkit.convert.marian import hf_marian_config_kwargs
from attnkit.data.tokenizer import SpecialIds
from attnkit.decode.beams import beam_search
from attnkit.decode.search import Search, greedy
from attnkit.errors import ConfigError, ConversionError
from attnkit.models.config import TransformerConfig
from attnkit.models.seq2seq import EncoderDecoder
from attnkit.nn.pointer import PointerGenerator
from attnkit.tasks.losses import generative_loss

IDS = SpecialIds(pad=0, unk=1, bos=2, eos=3)


@torch.no_grad()
def test_output_is_the_mixture_of_generating_and_copying_eq_9():
    torch.manual_seed(0)
    B, T, S, V, d = 2, 3, 5, 11, 8
    pointer = PointerGenerator(d)
    logits, hidden, memory = torch.randn(B, T, V), torch.randn(B, T, d), torch.randn(B, S, d)
    src = torch.tensor([[4, 7, 4, 9, 0], [5, 6, 8, 0, 0]])  # repeated 4; 0 = padding
    real = src != 0
    got = pointer(logits, hidden, pointer.keys(memory), memory, src, real[:, None, :])

    def lin(layer, x):
        return x @ layer.weight.double().t() + layer.bias.double()

    for b in range(B):
        keys = lin(pointer.key, memory[b].double())  # (S, d)
        for t in range(T):
            h = hidden[b, t].double()
            q = lin(pointer.query, h)
            e = [float(q @ keys[j]) / math.sqrt(d) if real[b, j] else -math.inf for j in range(S)]
            z = sum(math.exp(x) for x in e)
            alpha = [math.exp(x) / z for x in e]
            c = sum(alpha[j] * memory[b, j].double() for j in range(S))
            p_gen = torch.sigmoid(lin(pointer.switch, torch.cat([h, c]))).item()
            vocab = logits[b, t].double().softmax(-1)
            for w in range(V):
                copy = sum(alpha[j] for j in range(S) if src[b, j] == w)
                expected = p_gen * vocab[w].item() + (1 - p_gen) * copy
                assert math.exp(got[b, t, w].item()) == pytest.approx(expected, rel=1e-4, abs=1e-7)
    assert torch.allclose(got.exp().sum(-1), torch.ones(B, T), atol=1e-5)


def _copy_model(seed: int = 0) -> EncoderDecoder:
    torch.manual_seed(seed)
    return EncoderDecoder(TransformerConfig.from_preset("tiny", copy=True), 40, 40).eval()


def test_cached_decoding_with_beams_equals_one_forward_pass():
    model = _copy_model()
    src = torch.randint(4, 40, (3, 7))
    src[1, 4:] = 0
    tgt = torch.cat([torch.full((3, 1), 2), torch.randint(4, 40, (3, 4))], dim=1)
    with torch.no_grad():
        full = model(src, tgt).repeat_interleave(2, dim=0)  # (6, 5, V): each source twice, as 2 beams
        for use_cache in (True, False):
            decoding = model.decoding(src, use_cache=use_cache)
            decoding.repeat(2)
            tokens = tgt.repeat_interleave(2, dim=0)
            for t in range(1, 5):
                step = decoding.next_logits(tokens[:, :t])
                torch.testing.assert_close(step, full[:, t - 1], atol=1e-5, rtol=1e-5)
            decoding.keep(torch.tensor([4, 5]))  # the third source alone: its pointer reads its tokens
            last = decoding.next_logits(tokens[4:, :5])
            torch.testing.assert_close(last, full[4:, 4], atol=1e-5, rtol=1e-5)


def test_searches_agree_with_and_without_the_cache():
    model = _copy_model(seed=1)
    src = torch.randint(4, 40, (3, 6))
    src[2, 3:] = 0
    cached = beam_search(model, src, IDS, Search(beam_size=4, n_best=4))
    uncached = beam_search(model, src, IDS, Search(beam_size=4, n_best=4), use_cache=False)
    assert [[h.tokens for h in row] for row in cached] == [[h.tokens for h in row] for row in uncached]
    one_beam = [row[0].tokens for row in beam_search(model, src, IDS, Search(beam_size=1))]
    assert one_beam == greedy(model, src, IDS)


def _copy_task(low: int, high: int, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randint(low, high, (n, 6), generator=generator)
    return src, torch.cat([torch.full((n, 1), 2), src, torch.full((n, 1), 3)], dim=1)


def _first_token_accuracy_on_unseen_tokens(copy: bool) -> float:
    """Train on copying tokens 4-35, then copy tokens 36-63, which the model never saw anywhere."""
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(0)
    model = EncoderDecoder(TransformerConfig.from_preset("tiny", copy=copy), 64, 64)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        src, tgt = _copy_task(4, 36, 32, data)
        loss, _ = generative_loss(model, (src, tgt[:, :-1]), tgt[:, 1:], 0.0, 0)
        optimizer.zero_grad()
        (loss / tgt[:, 1:].numel()).backward()
        optimizer.step()
    src, tgt = _copy_task(36, 64, 200, data)
    with torch.no_grad():
        first = model.eval()(src, tgt[:, :1])[:, 0].argmax(-1)
    return (first == src[:, 0]).float().mean().item()


def test_it_copies_tokens_it_never_learned_to_generate():
    # the Generator alone gives a never-seen token no probability; the pointer reads it off the source
    assert _first_token_accuracy_on_unseen_tokens(copy=False) < 0.05
    assert _first_token_accuracy_on_unseen_tokens(copy=True) > 0.35


def test_copy_needs_one_vocabulary_and_is_refused_by_exports():
    with pytest.raises(ConfigError, match=r"model.copy .* \(model.share_embeddings=true\)"):
        TransformerConfig.from_preset("tiny", copy=True, share_embeddings=False)
    config = TransformerConfig.from_preset("tiny", copy=True, sinusoid_layout="concatenated")
    with pytest.raises(ConversionError, match=r"Marian has no copy mechanism.*model.copy=true"):
        hf_marian_config_kwargs(EncoderDecoder(config, 40, 40))
