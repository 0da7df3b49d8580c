"""A GPT's draft for speculative sampling (train/distill_draft.py with a temperature): its loss is the KL
divergence KL(p ‖ q) of the model's sampling distribution p from the draft's q, its agreement the
share of its sampled guesses the acceptance rule keeps, Σ_v min(p_v, q_v), and distillation raises it."""

from __future__ import annotations

import torch

from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.speculative_sampling import kept_by_sampling
from attnkit.models import build_model, from_preset
from attnkit.models.draft import ShallowCausalDraft
from attnkit.train.distill_draft import _continued, causal_agreement, distill_causal_draft, kl_loss
from tests.decode.drafting import trained_on

TEXT = "the cat sat on the mat. the dog sat on the log. a hen sat in a den. " * 8


def test_the_sampling_drafts_loss_is_the_kl_divergence_of_its_distribution_from_the_models():
    """KL(p ‖ q) = Σ_v p_v (log p_v − log q_v), q = softmax(logits / T), averaged over the real
    positions (written from the definition, in float64)."""
    torch.manual_seed(0)
    logits, target_logits = torch.randn(3, 5, 7), torch.randn(3, 5, 7)
    target = (target_logits / 0.7).softmax(-1)
    real = torch.rand(3, 5) > 0.3
    p, q = target.double(), (logits.double() / 0.7).softmax(-1)
    expected = (p * (p.log() - q.log())).sum(-1)[real].mean()
    torch.testing.assert_close(kl_loss(logits, target, real, 0.7).double(), expected, rtol=1e-5, atol=1e-6)
    assert float(kl_loss(target_logits, target, real, 0.7)) < 1e-6  # a draft that is the model: nothing


def test_the_acceptance_rule_keeps_a_sampled_guess_as_often_as_the_sum_of_the_minima():
    """The agreement a sampling draft is measured by, Σ_v min(p_v, q_v), is how often the acceptance
    rule (decode/speculative_sampling.py) keeps a guess drawn from q: counted over 20,000 draws."""
    p = torch.tensor([0.5, 0.2, 0.2, 0.1, 0.0])
    q = torch.tensor([0.1, 0.5, 0.2, 0.1, 0.1])
    generator = torch.Generator().manual_seed(0)
    draws = torch.multinomial(q, 20_000, replacement=True, generator=generator).tolist()
    kept = sum(len(kept_by_sampling(torch.stack([p, p]), q[None], [x], generator)) == 2 for x in draws)
    assert abs(kept / len(draws) - float(torch.minimum(p, q).sum())) < 0.015  # 0.5; sd of the share 0.0035


def test_a_gpts_draft_distilled_at_a_temperature_is_kept_more_often_than_its_start():
    """Distilled for a few seconds on the model's samples at temperature 1, the draft's expected
    acceptance on held-out samples rises above its start's (a copy of the model's first layer); a
    one-layer model's draft, its own layer, is kept every time."""
    tokenizer = Tokenizer.train("char", [TEXT])
    torch.manual_seed(0)
    config = from_preset("tiny-decoder", max_len=32)
    model = trained_on(build_model(config, tokenizer.vocab_size), tokenizer, TEXT, 40, 3e-3)
    made = distill_causal_draft(model, tokenizer.encode(TEXT * 3), tokenizer.specials, minutes=0.1,
                                batch_size=16, temperature=1.0)  # fmt: skip
    assert made.held_out_tokens > 100 and made.agreement_after > made.agreement_before + 0.02, made
    torch.manual_seed(1)
    one_layer = build_model(from_preset("tiny-decoder", max_len=32, layers=1), tokenizer.vocab_size).eval()
    prompts = [tokenizer.encode(TEXT)[i : i + 16] for i in range(0, 64, 16)]
    generator = torch.Generator().manual_seed(0)
    continued = _continued(one_layer, prompts, tokenizer.specials, 32, 1.0, generator)
    kept, count = causal_agreement(ShallowCausalDraft(one_layer), continued, 1.0)
    assert count > 40 and abs(kept - 1.0) < 1e-5
