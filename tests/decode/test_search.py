"""Greedy and beam search: beam 1 = greedy, cached = uncached, and beam finds better-scoring outputs."""

import pytest
import torch

from attnkit import build_transformer
from attnkit.data.tokenizer import SpecialIds
from attnkit.decode import beam_search, greedy, length_penalty

IDS = SpecialIds(pad=0, unk=1, bos=2, eos=3)  # the tiny model's sources below use ids 4..15
PAD_ID, BOS_ID, EOS_ID = IDS.pad, IDS.bos, IDS.eos


def _model_and_src(seed=0):
    torch.manual_seed(seed)
    model = build_transformer("tiny", 16).eval()
    with torch.no_grad():
        model.generator.proj.weight.mul_(4)  # sharper, more varied distributions than at init
    src = torch.randint(4, 16, (5, 7))
    src[1, 4:] = PAD_ID
    src[:, -1] = torch.where(src[:, -1] == PAD_ID, PAD_ID, EOS_ID)
    return model, src


def _log_prob(model, src, tokens):
    """log P(tokens + </s> | src) by teacher forcing, independent of the search code."""
    with torch.no_grad():
        tgt_in = torch.tensor([[BOS_ID, *tokens]])
        tgt_out = torch.tensor([[*tokens, EOS_ID]])
        logp = model(src[None], tgt_in).log_softmax(-1)
        return logp.gather(-1, tgt_out[..., None]).sum().item()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_equals_greedy(seed):
    model, src = _model_and_src(seed)
    greedy_out = greedy(model, src, IDS, max_len_a=1.0, max_len_b=5)
    beam_out = [h[0].tokens for h in beam_search(model, src, IDS, beam_size=1, max_len_a=1.0, max_len_b=5)]
    assert beam_out == greedy_out


def test_cached_search_equals_uncached():
    model, src = _model_and_src(3)
    assert greedy(model, src, IDS, use_cache=True) == greedy(model, src, IDS, use_cache=False)
    cached = beam_search(model, src, IDS, beam_size=4, n_best=4)
    uncached = beam_search(model, src, IDS, beam_size=4, n_best=4, use_cache=False)
    assert [[h.tokens for h in hs] for hs in cached] == [[h.tokens for h in hs] for hs in uncached]
    for a, b in zip(cached, uncached, strict=True):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_beam_scores_are_sequence_log_probabilities_and_beat_greedy():
    model, src = _model_and_src(4)
    greedy_out = greedy(model, src, IDS, max_len_a=1.0, max_len_b=6)
    beams = beam_search(model, src, IDS, beam_size=5, alpha=0.0, n_best=3, max_len_a=1.0, max_len_b=6)
    for row, (hyps, g) in enumerate(zip(beams, greedy_out, strict=True)):
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        real_src = src[row][src[row] != PAD_ID]
        for h in hyps:  # every hypothesis ends with </s>, forced at the length bound or not
            assert h.score == pytest.approx(_log_prob(model, real_src, h.tokens), abs=1e-4)
        assert hyps[0].score >= _log_prob(model, real_src, g) - 1e-5


def test_length_penalty_is_gnmt_and_n_best_is_checked():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 1.0) == pytest.approx(2.0)
    model, src = _model_and_src()
    with pytest.raises(ValueError, match="n_best"):
        beam_search(model, src, IDS, beam_size=2, n_best=3)


def test_outputs_respect_the_length_bound():
    model, src = _model_and_src(5)
    lengths = (src != PAD_ID).sum(-1)
    bounds = (0.5 * lengths + 1).long()  # tokens including </s>
    for row, out in enumerate(greedy(model, src, IDS, max_len_a=0.5, max_len_b=1)):
        assert len(out) <= bounds[row] - 1
    for row, hyps in enumerate(beam_search(model, src, IDS, beam_size=3, max_len_a=0.5, max_len_b=1)):
        assert len(hyps[0].tokens) <= bounds[row] - 1
        assert BOS_ID not in hyps[0].tokens and PAD_ID not in hyps[0].tokens


def test_beam_search_encodes_each_source_once_and_matches_searching_alone():
    """The K beams of a source share one encoding (not K), and each source's result is the one it gets
    when searched by itself (its beams never read another source's memory)."""
    model, src = _model_and_src(3)
    seen = []
    handle = model.encoder.register_forward_hook(lambda module, args, out: seen.append(out.size(0)))
    together = beam_search(model, src, IDS, beam_size=4, max_len_a=1.0, max_len_b=5)
    handle.remove()
    assert seen == [len(src)]
    for row, hypotheses in zip(src, together, strict=True):
        length = int((row != PAD_ID).sum())
        alone = beam_search(model, row[None, :length], IDS, beam_size=4, max_len_a=1.0, max_len_b=5)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in hypotheses]
