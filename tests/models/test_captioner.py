"""The Show-Attend-Tell captioner (models/captioner.py): its soft attention is Xu et al.'s additive
``f_att`` computed in float64 from the paper's equations; the doubly stochastic regularisation is eq. 14;
a search's caption is the step-by-step greedy argmax of full forward passes; hard attention attends to
one region; a small captioner learns to caption scenes it trains on."""

import pytest
import torch

from attnkit.config import DecodeConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.captions import caption
from attnkit.models.captioner import Captioner, CaptionerConfig
from tests.models.greedy_reference import greedy_by_full_passes

WORDS = ["a", "b", "c", "d"]


def _model(**changes):
    torch.manual_seed(0)
    config = CaptionerConfig.from_preset("captioner-tiny", image_size=24, **changes)
    return Captioner(config, 12)


def test_soft_attention_is_xus_additive_f_att_from_the_initial_state():
    """e_i = v_aᵀ tanh(W_a h_0 + U_a a_i + b), α = softmax(e) (Xu et al. eq. 4–5, with Bahdanau's f_att),
    h_0 = tanh(f_init(mean a)) (§3.1.2): in float64 from the model's weights, against its first step."""
    model = _model().double().eval()
    images = torch.rand(3, 1, 24, 24, dtype=torch.float64)
    a = model.encoder(images)  # (B, L, d): the annotations
    W = model.bridge.weight @ a.mean(1).T + model.bridge.bias[:, None]  # (2·d, B): [h_0; c_0]
    h0 = torch.tanh(W[: model.config.d_hidden]).T  # (B, d), the LSTM's h_0 (one layer)
    score = model.attention.score
    e = (
        torch.tanh(h0[:, None, :] @ score.W_a.weight.T + a @ score.U_a.weight.T + score.U_a.bias)
        @ score.v_a.weight.T
    )
    expected = torch.softmax(e.squeeze(-1), dim=-1)  # (B, L)
    tokens = torch.ones(3, 2, dtype=torch.long)
    assert torch.allclose(model.alignments(images, tokens)[:, 0], expected, atol=1e-12)
    assert model.alignments(images, tokens).shape == (3, 2, 9)  # 24 px: a 3×3 grid of regions


def test_the_doubly_stochastic_regularisation_is_xus_eq_14_over_the_real_steps():
    model = _model(doubly_stochastic=0.7).train()
    images, tgt_in = torch.rand(2, 1, 24, 24), torch.randint(1, 12, (2, 5))
    targets = tgt_in.clone()
    targets[1, 3:] = model.config.pad_id  # the second caption is three tokens long
    model(images, tgt_in)
    penalty = model.attention_penalty(targets)
    weights = model.alignments(images, tgt_in)  # dropout 0: the same weights
    first, second = weights[0].sum(0), weights[1, :3].sum(0)  # Σ_t α_ti over each caption's steps
    expected = 0.7 * ((1 - first) ** 2).sum() + 0.7 * ((1 - second) ** 2).sum()
    assert torch.allclose(penalty, expected, atol=1e-5)
    assert model.attention_penalty(targets) == 0  # once per forward


def test_a_searched_caption_is_the_greedy_argmax_of_full_forward_passes():
    model = _model().eval()
    tokenizer = Tokenizer.train("word", [" ".join(WORDS)], vocab_size=12)
    model = Captioner(
        CaptionerConfig.from_preset("captioner-tiny", image_size=24, max_len=6), tokenizer.vocab_size
    )
    images = torch.rand(4, 1, 24, 24)
    found = caption(model, tokenizer, images, DecodeConfig(beam_size=1, batch_size=3))
    for i in range(4):
        assert found[i] == greedy_by_full_passes(model, images[i : i + 1], tokenizer, limit=6)


def test_hard_attention_takes_one_region_sampled_in_training_and_the_likeliest_when_decoding():
    model = _model(hard=True, hard_expected=0.0)
    images = torch.rand(2, 1, 24, 24)
    model.train()
    source, _ = model.encode(images)
    context, alignment = model.attention(torch.randn(2, 1, model.config.d_hidden), 0, source)
    picked = [
        [bool(torch.equal(context[b, 0], source.annotations[b, i])) for i in range(9)] for b in range(2)
    ]
    assert all(sum(row) == 1 for row in picked)  # one region's annotation, not a blend
    assert alignment.log_prob.shape == (2,) and alignment.entropy.shape == (2,)
    model.eval()
    source, _ = model.encode(images)
    query = torch.randn(2, 1, model.config.d_hidden)
    context, alignment = model.attention(query, 0, source)
    best = alignment.weights.argmax(-1)
    assert torch.equal(context[:, 0], source.annotations[torch.arange(2), best])


@pytest.mark.parametrize("hard", [False, True], ids=["soft", "hard"])
def test_a_small_captioner_learns_the_captions_of_the_scenes_it_trains_on(hard):
    """Eight generated 24×24 'scenes' (a bright square in one of four quadrants, captioned by where it
    is): 300 steps of Adam, and greedy search gives every caption back."""
    torch.manual_seed(0)
    places = ["a b", "a c", "b d", "c d"]
    tokenizer = Tokenizer.train("word", [" ".join(WORDS)], vocab_size=12)
    images = torch.zeros(8, 1, 24, 24)
    captions = []
    for i in range(8):
        quadrant = i % 4
        top, left = divmod(quadrant, 2)
        images[i, 0, top * 12 + 2 : top * 12 + 10, left * 12 + 2 : left * 12 + 10] = 1.0
        captions.append(places[quadrant])
    config = CaptionerConfig.from_preset("captioner-tiny", image_size=24, hard=hard, max_len=6)
    model = Captioner(config, tokenizer.vocab_size)
    specials = tokenizer.specials
    ids = tokenizer.encode_batch(captions)
    tgt_in = torch.tensor([[specials.bos, *t] for t in ids])
    tgt_out = torch.tensor([[*t, specials.eos] for t in ids])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(300):
        logits = model(images, tgt_in)
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt_out, reduction="none")
        loss = nll.sum() + model.policy_loss(-nll.detach(), tgt_out) + model.attention_penalty(tgt_out)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert caption(model, tokenizer, images, DecodeConfig(beam_size=1)) == captions
