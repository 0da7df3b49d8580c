"""The RNN decoder's attention: global weights sum to one over the real tokens, Luong's local-m and
local-p windows and Gaussian as the paper defines them (recomputed here in float64 from eq. 9–10), and
hard attention that picks one annotation, samples from α, and learns by REINFORCE."""

import math

import pytest
import torch

from attnkit.attention.masks import padding_mask
from attnkit.models.rnn_attention import SourceAttention
from attnkit.nn.reinforce import reinforce_loss

D_HIDDEN = 8


def _setup(local="none", window=2, hard=False, score="general", lengths=(7, 4)):
    torch.manual_seed(0)
    attention = SourceAttention(score, D_HIDDEN, local, window, hard).double()
    S = max(lengths)
    src = torch.zeros(len(lengths), S, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, 20, (n,))
    annotations = torch.randn(len(lengths), S, D_HIDDEN, dtype=torch.float64)
    query = torch.randn(len(lengths), 1, D_HIDDEN, dtype=torch.float64)
    return attention, attention.prepare(annotations, padding_mask(src, 0)), query, torch.tensor(lengths)


def _general_softmax(attention, query, annotations, allowed):
    """Luong's general score ``h_tᵀ W_a h_s`` and a softmax over the allowed positions, in float64."""
    scores = torch.einsum("bd,bsd->bs", query[:, 0], attention.score.W_a(annotations))
    return scores.masked_fill(~allowed, -math.inf).softmax(-1)


@pytest.mark.parametrize("score", ["bahdanau", "dot", "general", "concat"])
def test_global_weights_sum_to_one_over_the_real_tokens_and_mix_the_annotations(score):
    attention, source, query, lengths = _setup(score=score)
    context, alignment = attention(query, 0, source)
    weights = alignment.weights  # (B, S)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, dtype=torch.float64))
    assert (weights[1, lengths[1] :] == 0).all() and (weights[1, : lengths[1]] > 0).all()
    torch.testing.assert_close(context[:, 0], torch.einsum("bs,bsd->bd", weights, source.annotations))


@pytest.mark.parametrize("t", [0, 3, 5, 9])
def test_local_m_attends_within_d_of_the_target_step(t):
    """Window [t - D, t + D] (Luong §3.2, p_t = t), clamped to the last source token past the end."""
    D = 2
    attention, source, query, lengths = _setup("local-m", window=D)
    _, alignment = attention(query, t, source)
    positions = torch.arange(source.annotations.size(1))
    for b, n in enumerate(lengths.tolist()):
        centre = min(t, n - 1)
        allowed = ((positions - centre).abs() <= D) & (positions < n)
        expected = _general_softmax(attention, query[b : b + 1], source.annotations[b : b + 1], allowed)
        torch.testing.assert_close(alignment.weights[b], expected[0])
        assert alignment.weights[b].sum().item() == pytest.approx(1.0)


def test_local_p_predicts_the_centre_and_weights_by_a_gaussian():
    """p_t = S · sigmoid(v_pᵀ tanh(W_p h_t)) (eq. 9); α = align · exp(-(s - p_t)² / 2σ²), σ = D/2 (eq. 10)."""
    D = 2
    attention, source, query, lengths = _setup("local-p", window=D)
    _, alignment = attention(query, 0, source)
    positions = torch.arange(source.annotations.size(1), dtype=torch.float64)
    for b, n in enumerate(lengths.tolist()):
        h = query[b, 0]
        p_t = n * torch.sigmoid(attention.v_p.weight[0] @ torch.tanh(attention.W_p.weight @ h))
        allowed = ((positions - p_t).abs() <= D) & (positions < n)
        align = _general_softmax(attention, query[b : b + 1], source.annotations[b : b + 1], allowed)[0]
        expected = align * torch.exp(-((positions - p_t) ** 2) / (2 * (D / 2) ** 2))
        torch.testing.assert_close(alignment.weights[b], expected)
        assert 0 < alignment.weights[b].sum() <= 1  # the Gaussian takes mass away: at most one


def test_local_p_trains_its_centre_through_the_gaussian():
    attention, source, query, _ = _setup("local-p")
    context, _ = attention(query, 0, source)
    context.sum().backward()
    assert attention.W_p.weight.grad.abs().sum() > 0 and attention.v_p.weight.grad.abs().sum() > 0


def test_hard_attention_samples_one_annotation_with_the_probabilities_of_alpha():
    attention, source, query, _ = _setup(hard=True)
    attention.eval()
    soft = _general_softmax(attention, query, source.annotations, source.mask[:, 0])  # (B, S)
    context, alignment = attention(query, 0, source)
    assert torch.equal(
        context[:, 0], source.annotations[torch.arange(2), soft.argmax(-1)]
    )  # decoding: argmax
    attention.train()
    torch.manual_seed(1)
    counts = torch.zeros_like(soft)
    for _ in range(4000):
        context, alignment = attention(query, 0, source)
        choice = (context - source.annotations).abs().sum(-1).argmin(-1)  # which annotation it took
        assert torch.equal(context[:, 0], source.annotations[torch.arange(2), choice])
        torch.testing.assert_close(alignment.log_prob, soft.gather(-1, choice[:, None])[:, 0].log())
        counts[torch.arange(2), choice] += 1
    assert (counts / 4000 - soft).abs().max() < 0.03  # 4,000 draws: standard error below 0.008
    torch.testing.assert_close(alignment.entropy, -(soft * soft.clamp(min=1e-300).log()).sum(-1))


def test_only_reinforce_trains_what_hard_attention_samples():
    """The sample is not differentiable: a loss of the context alone leaves the score without a gradient,
    and the REINFORCE surrogate, rewarding the choice of position 2, raises α there after one step."""
    attention, source, query, _ = _setup(hard=True, lengths=(6, 6))
    src = torch.ones(2, 6, dtype=torch.long)
    attention.train()
    source.annotations.requires_grad_()  # the encoder is trained through the annotation taken
    context, _ = attention(query, 0, source)
    context.sum().backward()
    assert source.annotations.grad.any()
    assert attention.score.W_a.weight.grad is None or not attention.score.W_a.weight.grad.any()
    before = attention.eval()(query, 0, source)[1].weights[:, 2]
    attention.train()
    optimiser = torch.optim.SGD(attention.parameters(), lr=0.5)
    optimiser.zero_grad()
    rewards, log_probs = [], []
    for _ in range(64):
        context, alignment = attention(query, 0, source)
        chose_2 = torch.isclose(context[:, 0], source.annotations[:, 2]).all(-1)
        rewards.append(chose_2.double())
        log_probs.append(alignment.log_prob)
    rewards, log_probs = torch.stack(rewards), torch.stack(log_probs)  # (64, B)
    reinforce_loss(log_probs, rewards, rewards.mean()).backward()
    optimiser.step()
    source = attention.prepare(source.annotations.detach(), padding_mask(src, 0))  # keys from the new W_a
    after = attention.eval()(query, 0, source)[1].weights[:, 2]
    assert (after > before).all(), (before, after)


def test_hard_attention_gradients_stay_finite_on_padded_sources():
    """The entropy bonus differentiates p·log p, whose gradient is infinite at p = 0 (padding) unless
    the logarithm is kept finite there; one NaN gradient would ruin every weight."""
    attention, source, query, _ = _setup(hard=True, lengths=(7, 3))
    attention.train()
    query.requires_grad_()
    _, alignment = attention(query, 0, source)
    (alignment.log_prob.sum() + alignment.entropy.sum()).backward()
    assert torch.isfinite(query.grad).all() and torch.isfinite(attention.score.W_a.weight.grad).all()


def test_hard_attention_gives_a_share_of_sentences_the_expected_context():
    """Xu et al. §4.1: with probability ``expected`` a training sentence takes Σ_j α_j h_j at every step
    instead of a sample; those rows train α by backpropagation and carry no REINFORCE log-probability."""
    attention, source, query, _ = _setup(hard=True, lengths=(6, 6))
    attention.expected = 0.5
    src = torch.ones(400, 6, dtype=torch.long)
    torch.manual_seed(3)
    marked = (
        attention.train()
        .prepare(torch.randn(400, 6, D_HIDDEN, dtype=torch.float64), padding_mask(src, 0))
        .expected
    )
    assert abs(marked.double().mean().item() - 0.5) < 0.1  # 400 sentences: standard error 0.025
    assert (
        attention.eval().prepare(source.annotations, padding_mask(src[:2], 0)).expected is None
    )  # decoding: argmax
    attention.train()
    source.expected = torch.tensor([True, False]).view(2, 1, 1)
    context, alignment = attention(query, 0, source)
    soft = _general_softmax(attention, query, source.annotations, source.mask[:, 0])  # (B, S)
    torch.testing.assert_close(context[0, 0], soft[0] @ source.annotations[0])  # the expectation
    assert alignment.log_prob[0] == 0 and alignment.log_prob[1] < 0
    assert alignment.entropy[0] == 0 and alignment.entropy[1] > 0  # the bonus is for sampled rows only
    assert (source.annotations[1] == context[1]).all(-1).any()  # row 1 still took one annotation
    context[0].sum().backward()
    assert attention.score.W_a.weight.grad.abs().sum() > 0  # α learns through the expected context


def test_hard_attention_can_start_soft():
    """With ``soft_batches = 2`` the first two training batches give every sentence the expected context,
    then the share is ``expected`` again; evaluation does not count."""
    attention, *_ = _setup(hard=True, lengths=(6, 6))
    attention.expected, attention.soft_batches = 0.0, 2
    attention.batches.zero_()
    src = torch.ones(50, 6, dtype=torch.long)
    annotations = torch.randn(50, 6, D_HIDDEN, dtype=torch.float64)
    attention.eval().prepare(annotations, padding_mask(src, 0))
    shares = [attention.train().prepare(annotations, padding_mask(src, 0)).expected for _ in range(3)]
    assert shares[0].all() and shares[1].all() and shares[2] is None  # then expected = 0: all sampled
    assert attention.batches.item() == 3


def test_under_bf16_autocast_hard_attention_samples_from_float32_probabilities():
    """REINFORCE's gradient is ∇ log p(s): bf16's 8-bit mantissa would make it coarse, so the policy's
    distribution stays float32 under autocast (the annotations and the score's products are bf16), as
    the softmax of a float32 run, to bf16's rounding of the scores."""
    torch.manual_seed(0)
    attention = SourceAttention("general", D_HIDDEN, hard=True).train()
    src = torch.randint(4, 20, (3, 6))
    annotations, query = torch.randn(3, 6, D_HIDDEN), torch.randn(3, 1, D_HIDDEN)
    with torch.autocast("cpu", torch.bfloat16):
        _, alignment = attention(query, 0, attention.prepare(annotations, padding_mask(src, 0)))
    assert alignment.weights.dtype == alignment.log_prob.dtype == torch.float32
    _, exact = attention.eval()(query, 0, attention.prepare(annotations, padding_mask(src, 0)))
    torch.testing.assert_close(alignment.weights, exact.weights, atol=0.02, rtol=0.05)


def _location_aware_reference(score, annotations, allowed, queries):
    """Chorowski et al. (2015) eq. 8–9 in float64 with plain loops, from the score's weights: ``f_i = F *
    α_{i-1}`` (PyTorch's correlation: ``f_ij[k] = Σ_r F[k, r] α_{i-1, j + r - ⌊w/2⌋}``, zero outside),
    ``e_ij = wᵀ tanh(W s_i + V h_j + b + U f_ij)``, α_i = softmax over the real positions; α_0 all on
    the first position."""
    B, S, _ = annotations.shape
    F_, width = score.F.weight[:, 0], score.F.weight.size(-1)  # (filters, width)
    previous = torch.zeros(B, S, dtype=torch.float64)
    previous[:, 0] = 1
    steps = []
    for s in queries:  # s: (B, d)
        f = torch.zeros(B, S, F_.size(0), dtype=torch.float64)
        for j in range(S):
            for r in range(width):
                source = j + r - width // 2
                if 0 <= source < S:
                    f[:, j] += previous[:, source, None] * F_[:, r]
        e = score.w(torch.tanh(score.W(s)[:, None] + score.V(annotations) + score.U(f))).squeeze(-1)
        previous = e.masked_fill(~allowed, -math.inf).softmax(-1)
        steps.append(previous)
    return steps


def test_location_aware_attention_is_chorowskis_eq_8_and_9_step_after_step():
    """Three steps of location-aware attention (each reading the weights of the one before) against the
    paper's equations recomputed in float64; the weights then differ from plain additive attention's."""
    attention, source, _, lengths = _setup(score="location", lengths=(9, 5))
    allowed = torch.arange(9)[None, :] < lengths[:, None]  # (B, S)
    queries = [torch.randn(2, D_HIDDEN, dtype=torch.float64) for _ in range(3)]
    expected = _location_aware_reference(attention.score, source.annotations, allowed, queries)
    for t, (query, want) in enumerate(zip(queries, expected, strict=True)):
        context, alignment = attention(query[:, None], t, source)
        torch.testing.assert_close(alignment.weights, want, rtol=0, atol=1e-12)
        torch.testing.assert_close(context[:, 0], torch.einsum("bs,bsd->bd", want, source.annotations))
    with torch.no_grad():
        attention.score.U.weight.zero_()  # without the location term: Bahdanau's additive score
    source = attention.prepare(source.annotations, allowed[:, None])
    _, alignment = attention(queries[0][:, None], 0, source)
    plain = attention.score.w(
        torch.tanh(attention.score.W(queries[0])[:, None] + attention.score.V(source.annotations))
    )
    torch.testing.assert_close(
        alignment.weights, plain.squeeze(-1).masked_fill(~allowed, -math.inf).softmax(-1)
    )


def test_median_windowing_attends_within_d_of_the_last_steps_median():
    """Bahdanau et al. (2016) §3.2: step t sees only the positions within D of the median of step t-1's
    weights (the first position whose cumulative weight reaches one half); the first step, of weights
    all on the first position, sees the first D + 1."""
    attention, source, _, lengths = _setup(score="location", local="median", window=2, lengths=(12, 9))
    medians = [torch.zeros(2)]
    for t in range(4):
        _, alignment = attention(torch.randn(2, 1, D_HIDDEN, dtype=torch.float64), t, source)
        weights = alignment.weights.detach()  # (B, S)
        for b in range(2):
            m = int(medians[-1][b])
            outside = [j for j in range(12) if abs(j - m) > 2]
            assert weights[b, outside].abs().max() == 0
            assert weights[b, : int(lengths[b])].sum() == pytest.approx(1.0)
        cumulative = weights.cumsum(-1)
        medians.append(
            torch.tensor([float(next(j for j in range(12) if cumulative[b, j] >= 0.5)) for b in range(2)])
        )
