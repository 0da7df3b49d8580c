"""Greedy and beam search: beam 1 = greedy, cached = uncached, and beam finds better-scoring outputs."""

import math
from typing import ClassVar

import pytest
import torch

from attnkit import build_transformer
from attnkit.cpu.search import RuledOut, best_by_blocks
from attnkit.data.tokenizer import SpecialIds
from attnkit.decode import Search, beam_search, greedy, length_penalty
from attnkit.decode.beams import beam
from attnkit.decode.search import argmax, best_continuations, next_log_probs
from attnkit.ranking import top_k

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
    greedy_out = greedy(model, src, IDS, Search(max_len_a=1.0, max_len_b=5))
    beam_out = [
        h[0].tokens for h in beam_search(model, src, IDS, Search(beam_size=1, max_len_a=1.0, max_len_b=5))
    ]
    assert beam_out == greedy_out


def test_cached_search_equals_uncached():
    model, src = _model_and_src(3)
    assert greedy(model, src, IDS, use_cache=True) == greedy(model, src, IDS, use_cache=False)
    cached = beam_search(model, src, IDS, Search(beam_size=4, n_best=4))
    uncached = beam_search(model, src, IDS, Search(beam_size=4, n_best=4), use_cache=False)
    assert [[h.tokens for h in hs] for hs in cached] == [[h.tokens for h in hs] for hs in uncached]
    for a, b in zip(cached, uncached, strict=True):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_beam_scores_are_sequence_log_probabilities_and_beat_greedy():
    model, src = _model_and_src(4)
    greedy_out = greedy(model, src, IDS, Search(max_len_a=1.0, max_len_b=6))
    beams = beam_search(model, src, IDS, Search(beam_size=5, alpha=0.0, n_best=3, max_len_a=1.0, max_len_b=6))
    for row, (hyps, g) in enumerate(zip(beams, greedy_out, strict=True)):
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        real_src = src[row][src[row] != PAD_ID]
        for h in hyps:  # every hypothesis ends with </s>, forced at the length bound or not
            assert h.score == pytest.approx(_log_prob(model, real_src, h.tokens), abs=1e-4)
        assert hyps[0].score >= _log_prob(model, real_src, g) - 1e-5


def test_length_penalties_are_gnmts_and_the_plain_lengths_and_arguments_are_checked():
    assert length_penalty(1, 0.6, "gnmt") == pytest.approx(1.0)  # ((5 + 1) / 6) ** 0.6
    assert length_penalty(7, 1.0, "gnmt") == pytest.approx(2.0)  # (5 + 7) / 6
    assert length_penalty(7, 1.0, "length") == pytest.approx(7.0)
    assert length_penalty(9, 0.5, "length") == pytest.approx(3.0)
    model, src = _model_and_src()
    with pytest.raises(ValueError, match="n_best"):
        beam_search(model, src, IDS, Search(beam_size=2, n_best=3))
    with pytest.raises(ValueError, match="unknown length penalty 'wu'"):
        beam_search(model, src, IDS, Search(beam_size=2, penalty="wu"))


@pytest.mark.parametrize("penalty", ["length", "gnmt"])
def test_hypotheses_are_scored_and_ranked_by_log_probability_over_the_length_penalty(penalty):
    """The score of every finished hypothesis is log P(Y|X) / lp(|Y|), |Y| counting </s> (HF's
    ``sum_logprobs / generated_len ** length_penalty``; GNMT's eq. 14), best first."""
    model, src = _model_and_src(7)
    alpha = 1.0
    lp = {"length": lambda n: n**alpha, "gnmt": lambda n: ((5 + n) / 6) ** alpha}[penalty]
    beams = beam_search(model, src, IDS, Search(beam_size=4, alpha=alpha, n_best=4, penalty=penalty))
    for row, hyps in enumerate(beams):
        real_src = src[row][src[row] != PAD_ID]
        expected = [_log_prob(model, real_src, h.tokens) / lp(len(h.tokens) + 1) for h in hyps]
        assert [h.score for h in hyps] == pytest.approx(expected, abs=1e-4)
        assert expected == sorted(expected, reverse=True)


def test_outputs_respect_the_length_bound():
    model, src = _model_and_src(5)
    lengths = (src != PAD_ID).sum(-1)
    bounds = (0.5 * lengths + 1).long()  # tokens including </s>
    for row, out in enumerate(greedy(model, src, IDS, Search(max_len_a=0.5, max_len_b=1))):
        assert len(out) <= bounds[row] - 1
    for row, hyps in enumerate(beam_search(model, src, IDS, Search(beam_size=3, max_len_a=0.5, max_len_b=1))):
        assert len(hyps[0].tokens) <= bounds[row] - 1
        assert BOS_ID not in hyps[0].tokens and PAD_ID not in hyps[0].tokens


def test_beam_search_encodes_each_source_once_and_matches_searching_alone():
    """The K beams of a source share one encoding (not K), and each source's result is the one it gets
    when searched by itself (its beams never read another source's memory)."""
    model, src = _model_and_src(3)
    seen = []
    handle = model.encoder.register_forward_hook(lambda module, args, out: seen.append(out.size(0)))
    together = beam_search(model, src, IDS, Search(beam_size=4, max_len_a=1.0, max_len_b=5))
    handle.remove()
    assert seen == [len(src)]
    for row, hypotheses in zip(src, together, strict=True):
        length = int((row != PAD_ID).sum())
        alone = beam_search(model, row[None, :length], IDS, Search(beam_size=4, max_len_a=1.0, max_len_b=5))[
            0
        ]
        assert [h.tokens for h in alone] == [h.tokens for h in hypotheses]


class ScriptedDecoding:
    """A "model" whose next-token probabilities are written out by hand for each prefix (ids: A=4, C=6)."""

    A, B, C = 4, 5, 6
    NEXT: ClassVar = {  # generated prefix -> {token: probability}; the rest of the mass on C
        (): {A: 0.9, EOS_ID: 0.08, B: 0.02},
        (A,): {C: 0.95, EOS_ID: 0.05},
        (B,): {EOS_ID: 0.95, C: 0.05},
        (A, C): {EOS_ID: 0.9, C: 0.1},
    }

    def next_logits(self, tokens):
        rows = []
        for prefix in tokens[:, 1:].tolist():
            probs = torch.full((8,), 1e-12)
            for token, p in self.NEXT.get(tuple(prefix), {EOS_ID: 0.5, self.C: 0.5}).items():
                probs[token] = p
            rows.append(probs.log())
        return torch.stack(rows)

    def reorder(self, index):
        pass

    keep = repeat = reorder


def test_search_ends_when_no_running_beam_is_better_or_at_k_finished():
    """Beam 2, alpha 0, by hand: step 1 finishes "" (log 0.08) and keeps A, B; step 2 finishes "A" (log
    0.9·0.05) and "B" (log 0.02·0.95), runs on with "A C" (log 0.9·0.95). "k-finished" stops there with
    "" as its best; "no-better" sees that "A C" still beats its finished ones and finds "A C </s>"
    (log 0.9·0.95·0.9), the more probable output."""
    start, limits = torch.full((1, 1), BOS_ID), torch.tensor([8])
    hasty = beam(
        ScriptedDecoding(), start, limits, IDS, Search(beam_size=2, alpha=0.0, n_best=2, stop="k-finished")
    )[0]
    patient = beam(
        ScriptedDecoding(), start, limits, IDS, Search(beam_size=2, alpha=0.0, n_best=2, stop="no-better")
    )[0]
    A, C = ScriptedDecoding.A, ScriptedDecoding.C
    assert [(h.tokens, h.score) for h in hasty] == [([], pytest.approx(math.log(0.08))),
                                                    ([A], pytest.approx(math.log(0.9 * 0.05)))]  # fmt: skip
    assert [(h.tokens, h.score) for h in patient] == [([A, C], pytest.approx(math.log(0.9 * 0.95 * 0.9))),
                                                      ([], pytest.approx(math.log(0.08)))]  # fmt: skip
    with pytest.raises(ValueError, match="unknown stopping rule 'soon'"):
        beam(ScriptedDecoding(), start, limits, IDS, Search(beam_size=2, stop="soon"))


def _rows_decoded(model, search):
    """What ``search()`` returns, and the number of rows the decoder ran at each step."""
    rows = []
    handle = model.decoder.register_forward_hook(lambda module, args, out: rows.append(out.size(0)))
    try:
        return search(), rows
    finally:
        handle.remove()


def test_a_finished_source_leaves_the_batch_and_the_others_results_do_not_change():
    """Once a source's search is over (here: the one-token source, whose length bound is 2), the later
    steps decode only the other sources' rows, in greedy and in beam search; what each source gets is
    still what it gets when searched by itself."""
    model, src = _model_and_src(6)
    src[2, 1:] = PAD_ID  # one token: at most 1.0 * 1 + 1 = 2 output tokens, the others up to 8
    bounds = {"max_len_a": 1.0, "max_len_b": 1}
    greedy_out, greedy_rows = _rows_decoded(model, lambda: greedy(model, src, IDS, Search(**bounds)))
    beams, beam_rows = _rows_decoded(
        model, lambda: beam_search(model, src, IDS, Search(beam_size=3, **bounds))
    )
    assert greedy_rows[:2] == [5, 5] and len(greedy_rows) > 2 and max(greedy_rows[2:]) <= 4
    assert beam_rows[:2] == [5, 15] and len(beam_rows) > 2 and max(beam_rows[2:]) <= 12  # B, B·K, then 4·3
    assert greedy_rows == sorted(greedy_rows, reverse=True)
    assert beam_rows[1:] == sorted(beam_rows[1:], reverse=True)
    for row in range(len(src)):
        alone = src[row][src[row] != PAD_ID][None]
        assert greedy(model, alone, IDS, Search(**bounds))[0] == greedy_out[row]
        assert (
            beam_search(model, alone, IDS, Search(beam_size=3, **bounds))[0][0].tokens == beams[row][0].tokens
        )


class RandomLogits:
    """Fixed random logits for each row, whatever the tokens (for testing one step of the search)."""

    def __init__(self, logits, copy=True):
        self.logits, self.copy = logits, copy

    def next_logits(self, tokens):
        return self.logits.clone() if self.copy else self.logits


@pytest.mark.parametrize(
    "V", [50, 8000, 8001, 1030], ids=["few tokens", "whole blocks", "a partial block", "V=1030"]
)
@pytest.mark.parametrize("K", [1, 3, 5])
def test_best_continuations_are_the_top_of_all_k_times_v_candidates(K, V):
    """Each beam's best 2K tokens and the log-normaliser give what the top 2K of every source's K·V
    candidates (score + log_softmax, the textbook step) give: the same scores, beams and tokens, with
    <pad>/<s> never chosen, rows at their bound only ending, and dead beams (score -inf) never chosen;
    with few tokens per row, and by blocks (with the last block partial or not)."""
    torch.manual_seed(K + V)
    n = 4
    logits = torch.randn(n * K, V) * 3
    logits[-1, -1] += 20  # the last beam's last token wins: in the partial block, where there is one
    scores = torch.randn(n, K) - 5
    scores[0, 1:] = float("-inf")  # a source whose other beams are dead (the first step)
    at_limit = torch.zeros(n * K, dtype=torch.bool)
    at_limit[K : 2 * K] = True  # the second source is at its length bound: </s> only
    got_scores, got_beams, got_tokens = best_continuations(RandomLogits(logits), torch.zeros(n * K, 1),
                                                           at_limit, IDS, scores, 2 * K)  # fmt: skip
    log_probs = logits.log_softmax(-1)
    log_probs[:, [IDS.pad, IDS.bos]] = float("-inf")
    log_probs[at_limit] = torch.where(torch.arange(V) == IDS.eos, log_probs[at_limit], float("-inf"))
    every = (scores.view(-1, 1) + log_probs).view(n, K * V)
    want_scores, want_index = every.topk(2 * K, dim=-1)
    alive = want_scores > float("-inf")
    torch.testing.assert_close(got_scores, want_scores)
    assert torch.equal((got_beams * V + got_tokens)[alive], want_index[alive])
    assert not torch.isin(got_tokens[alive], torch.tensor([IDS.pad, IDS.bos])).any()
    assert (got_tokens[1][alive[1]] == IDS.eos).all() and alive[1].sum() == K  # one </s> per live beam
    assert (got_beams[0][alive[0]] == 0).all()  # only beam 0 of the first source is alive


@pytest.mark.parametrize("V", [8000, 8001, 9999, 300])
@pytest.mark.parametrize("k", [1, 10, 20])
def test_blockwise_top_k_equals_torch_topk(V, k):
    """Values and positions as torch.topk's, including a partial last block, the largest entries all in
    one block or in the last partial block, and rows that are mostly -inf (rows at their bound)."""
    torch.manual_seed(V + k)
    x = torch.randn(12, V)
    x[1, 64:128] += 10  # one block holds the whole top
    x[2, -(V % 64 or 64) :] += 10  # the last (partial) block holds it
    x[3] = float("-inf")
    x[3, V // 2] = 0.0  # one finite entry
    values, index = top_k(x, k)
    want_values, want_index = x.topk(k, dim=-1)
    torch.testing.assert_close(values, want_values)
    finite = want_values > float("-inf")
    assert torch.equal(index[finite], want_index[finite])  # no ties among finite random entries


@pytest.mark.parametrize("V", [8000, 8001, 300])
@pytest.mark.parametrize("K", [1, 3])
def test_equal_continuations_rank_by_beam_then_token_as_argmax_takes_the_first(K, V):
    """Ties (common in bf16's coarse products) are broken by a fixed rule, the first beam and token of
    equals first, as greedy search's argmax does: a beam of one then chooses what greedy search
    chooses, and a row's choice does not depend on its batch (docs/invariance.md). Integer-valued
    log-probabilities are full of ties, across blocks, beams and the last partial block."""
    torch.manual_seed(K + V)
    n = 3
    logits = torch.randint(0, 4, (n * K, V)).float()
    logits[:, -1] = 3.0  # the last token ties with the best everywhere
    scores = torch.zeros(n, K)
    running = torch.zeros(n * K, dtype=torch.bool)  # no row at its bound
    _, beams, tokens = best_continuations(
        RandomLogits(logits), torch.zeros(n * K, 1), running, IDS, scores, 2 * K
    )
    log_probs = logits.log_softmax(-1)
    log_probs[:, [IDS.pad, IDS.bos]] = float("-inf")
    every = log_probs.view(n, K * V)  # by beam·V + token
    for row in range(n):
        order = sorted(range(K * V), key=lambda i: (-every[row, i].item(), i))[: 2 * K]  # value, then index
        assert (beams[row] * V + tokens[row]).tolist() == order
    if K == 1:
        assert torch.equal(tokens[:, 0], argmax(log_probs))
    _, index = top_k(logits, 2 * K)
    for row in range(n * K):
        assert index[row].tolist() == sorted(range(V), key=lambda i: (-logits[row, i].item(), i))[: 2 * K]


@pytest.mark.parametrize("V", [8000, 8001, 1030])
@pytest.mark.parametrize("ties", [False, True], ids=["random", "integer-valued"])
def test_ranking_logits_with_their_normaliser_is_ranking_their_log_probabilities(V, ties):
    """A compiled beam step ranks the logits and applies the log-softmax, ``(x - max) - log(sum(exp(x -
    max)))``, only to the block maxima and the chosen blocks' entries (best_by_blocks' ``normaliser``):
    each rounding keeps a row's order, so the scores, beams and tokens are exactly those of ranking the
    log-probabilities written out, ties, tokens ruled out (-inf) and a partial last block included."""
    torch.manual_seed(V)
    n, K = 3, 2  # (2K blocks of 64 at most a quarter of V: ranked by blocks)
    logits = torch.randint(0, 4, (n * K, V)).float() if ties else torch.randn(n * K, V) * 3
    scores = torch.randn(n, K) - 5
    scores[0, 1:] = float("-inf")  # dead beams
    maximum = logits.amax(-1)
    log_sum = (logits - maximum[:, None]).exp().sum(-1).log()
    ruled_out = logits.masked_fill(torch.rand(n * K, V) < 0.3, float("-inf"))
    ruled_out[:, [IDS.pad, IDS.bos]] = float("-inf")
    log_probs = (ruled_out - maximum[:, None]) - log_sum[:, None]  # every entry normalised first
    kept = ruled_out > float("-inf")
    torch.testing.assert_close(log_probs[kept], logits.log_softmax(-1)[kept])  # (torch's log-softmax)
    expected = best_by_blocks(log_probs, scores, 2 * K)
    found = best_by_blocks(ruled_out, scores, 2 * K, (maximum, log_sum))
    assert expected is not None and found is not None
    for got, want in zip(found, expected, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("V", [8000, 8001, 1030])
def test_ruling_tokens_out_where_the_ranking_reads_them_is_ruling_them_out_first(V):
    """A compiled beam step leaves its logits as they are and rules out the tokens the search rules out
    where its ranking reads them (best_by_blocks' ``ruled_out``): the scores, beams and tokens are
    exactly those of ranking the logits the search writes (``next_log_probs``: the tokens never
    generated at -inf, and in rows at their length bound every token but </s>), with the never
    generated tokens the largest logits, sources whose every beam is at its bound, and </s> in the first
    block, in the last whole one or past the whole blocks."""
    torch.manual_seed(V)
    n, K = 4, 2
    at_limit = torch.tensor([False, True, False, False, True, True, False, False])  # (n·K,)
    for eos in (IDS.eos, V - 1):
        specials = SpecialIds(pad=IDS.pad, unk=IDS.unk, bos=IDS.bos, eos=eos)
        logits = torch.randn(n * K, V) * 3
        logits[:, [IDS.pad, IDS.bos]] = 20.0  # the largest, never to be taken
        scores = torch.randn(n, K) - 5
        maximum = logits.amax(-1)
        log_sum = (logits - maximum[:, None]).exp().sum(-1).log()
        written = next_log_probs(RandomLogits(logits.clone()), torch.zeros(n * K, 1), at_limit, specials,
                                 normalised=False)  # fmt: skip
        expected = best_by_blocks(written, scores, 2 * K, (maximum, log_sum))
        ever = torch.ones(V, dtype=torch.bool)
        ever[[IDS.pad, IDS.bos]] = False
        end = torch.zeros(V, dtype=torch.bool)
        end[eos] = True
        found = best_by_blocks(logits, scores, 2 * K, (maximum, log_sum), RuledOut(ever, end, at_limit))
        assert expected is not None and found is not None
        for got, want in zip(found, expected, strict=True):
            assert torch.equal(got, want)
        best, _, tokens = found
        assert (tokens[2][best[2] > float("-inf")] == eos).all()  # source 2: both beams at their bound
        assert not torch.isin(tokens[best > float("-inf")], torch.tensor([IDS.pad, IDS.bos])).any()


@pytest.mark.parametrize("V", [8000, 8001, 9999, 300, 100])
def test_blockwise_argmax_equals_torch_argmax_ties_included(V):
    """The first largest entry of each row, as Tensor.argmax: ties inside a block, across blocks and
    with the last (partial) block, rows of -inf but one entry, and integer-valued rows full of ties."""
    torch.manual_seed(V)
    x = torch.randn(10, V)
    x[1, 70] = x[1, V - 5] = 50.0  # a tie across blocks: the first wins
    x[2, 65] = x[2, 66] = 50.0  # inside one block
    x[3, -1] = 60.0  # the last entry (in the partial block, where there is one)
    x[4, 10] = x[4, -1] = 60.0  # a tie between the first block and the last entry: the first wins
    x[5] = float("-inf")
    x[5, V // 3] = 0.0
    x[6] = torch.randint(0, 3, (V,)).float()  # ties everywhere
    for rows in (x, x[:, : V - 1], x.bfloat16()):  # a strided view, another dtype
        assert torch.equal(argmax(rows), rows.argmax(-1))


def test_greedy_search_takes_the_unnormalised_logits_in_its_bounds():
    """Greedy search chooses from the logits (no log-softmax: the same order), with <pad> and <s>
    never chosen and rows at their bound ending, as from log-probabilities."""
    model, src = _model_and_src(6)
    with torch.no_grad():
        model.generator.proj.weight[IDS.pad] += 5.0  # <pad> would be the most probable token
    outputs = greedy(model, src, IDS, Search(max_len_a=0.0, max_len_b=3))
    assert all(len(out) <= 2 for out in outputs)  # 3 tokens with </s>
    assert not any(IDS.pad in out or IDS.bos in out for out in outputs)
    with torch.no_grad():  # the same choices as from the log-probabilities, step by step
        steps = model.decoding(src)
        tokens = torch.full((src.size(0), 1), IDS.bos)
        at_limit = torch.zeros(src.size(0), dtype=torch.bool)
        log_probs = next_log_probs(steps, tokens, at_limit, IDS)
    assert [out[0] for out in outputs if out] == [
        t for t, out in zip(log_probs.argmax(-1).tolist(), outputs, strict=True) if out
    ]


@pytest.mark.parametrize("kind", ["float32", "strided view", "bfloat16"])
def test_next_log_probs_are_the_log_softmax_of_any_logits(kind):
    """float32 logits are overwritten by their log-probabilities; whatever the logits (a strided view of
    a larger output, a lower precision), the result is log_softmax in float32, with <pad> and <s> at
    -inf and rows at their bound keeping only </s>, at its probability."""
    torch.manual_seed(0)
    full = torch.randn(6, 3, 40) * 4
    choices = {"float32": full[:, -1].clone(), "strided view": full[:, 0], "bfloat16": full[:, -1].bfloat16()}
    logits = choices[kind]
    want = logits.double().log_softmax(-1)  # the textbook normalisation, before anything is overwritten
    at_limit = torch.tensor([False, True, False, False, True, False])
    got = next_log_probs(RandomLogits(logits, copy=False), torch.zeros(6, 1), at_limit, IDS)
    assert got.dtype == torch.float32
    assert (got.data_ptr() == logits.data_ptr()) == (kind == "float32")  # overwritten: float32, contiguous
    want[:, [IDS.pad, IDS.bos]] = float("-inf")
    want[at_limit] = torch.where(torch.arange(40) == IDS.eos, want[at_limit], float("-inf"))
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
