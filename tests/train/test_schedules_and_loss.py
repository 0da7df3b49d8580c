"""The schedules are the paper's formulas; the loss is label-smoothed cross-entropy ignoring padding."""

import math

import pytest
import torch

from attnkit.tasks.losses import label_smoothed_loss
from attnkit.train.schedules import inverse_sqrt, learning_rate_fn, make_scheduler, noam


def annotated_rate(step, model_size, factor, warmup):
    """The Annotated Transformer's rate(), written independently."""
    if step == 0:
        step = 1
    return factor * (model_size ** (-0.5) * min(step ** (-0.5), step * warmup ** (-1.5)))


@pytest.mark.parametrize("step", [1, 10, 3999, 4000, 4001, 100000])
def test_noam_is_the_papers_equation_3(step):
    assert noam(step, 512, 4000) == pytest.approx(annotated_rate(step, 512, 1.0, 4000))


def test_noam_peaks_at_the_end_of_warmup_and_inverse_sqrt_peaks_at_lr():
    rates = [noam(s, 512, 400) for s in range(1, 2000)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == 400
    assert inverse_sqrt(400, 5e-4, 400) == pytest.approx(5e-4)
    assert inverse_sqrt(1600, 5e-4, 400) == pytest.approx(2.5e-4)


def nanogpt_get_lr(it, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    """nanoGPT's train.py get_lr(it), written out independently (iterations count from 0)."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def test_cosine_is_nanogpts_schedule_through_the_scheduler():
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    scheduler = make_scheduler(optimizer, learning_rate_fn("cosine", 1e-3, 100, 384, 5000, 1e-4))
    for it in range(5200):  # the optimizer's it-th update uses the rate after `it` scheduler steps
        assert optimizer.param_groups[0]["lr"] == pytest.approx(nanogpt_get_lr(it, 1e-3, 100, 5000, 1e-4))
        optimizer.step()
        scheduler.step()


def test_unknown_schedule_is_a_config_error():
    from attnkit.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train\.schedule"):
        learning_rate_fn("linear", 1.0, 100, 512)


def annotated_label_smoothing(log_probs, target, padding_idx, smoothing):
    """The Annotated Transformer's LabelSmoothing criterion, written out independently:
    ``true_dist`` gets smoothing / (size - 2) everywhere, the confidence 1 - smoothing on the target,
    0 on the padding column and 0 on rows whose target is padding; the loss is KLDivLoss(sum)."""
    size = log_probs.size(1)
    true_dist = torch.full_like(log_probs, smoothing / (size - 2))
    true_dist.scatter_(1, target.unsqueeze(1), 1.0 - smoothing)
    true_dist[:, padding_idx] = 0
    true_dist[target == padding_idx] = 0
    kl = torch.nn.KLDivLoss(reduction="sum")(log_probs, true_dist)
    return kl, true_dist


@pytest.mark.parametrize("pad_id", [0, 5])
def test_label_smoothing_is_the_annotated_transformers_no_mass_on_pad(pad_id):
    torch.manual_seed(0)
    V, eps = 7, 0.1
    logits = torch.randn(2, 3, V, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([[4, 1, pad_id], [6, pad_id, pad_id]])
    loss, nll = label_smoothed_loss(logits, target, eps, pad_id)

    reference_logits = logits.detach().clone().requires_grad_(True)
    log_probs = reference_logits.log_softmax(-1).flatten(0, 1)
    kl, true_dist = annotated_label_smoothing(log_probs, target.flatten(), pad_id, eps)
    # Ours is the cross-entropy with the same target distribution: KL + its (constant) entropy.
    entropy = -(true_dist[true_dist > 0] * true_dist[true_dist > 0].log()).sum()
    assert loss.item() == pytest.approx((kl + entropy).item(), rel=1e-9)
    loss.backward()
    kl.backward()
    torch.testing.assert_close(logits.grad, reference_logits.grad)  # the same training signal

    real = target != pad_id
    expected_nll = -log_probs[real.flatten()].gather(1, target[real][:, None]).sum()
    assert nll.item() == pytest.approx(expected_nll.item(), rel=1e-9)


def test_label_smoothing_differs_from_pytorchs_which_puts_mass_on_pad():
    torch.manual_seed(1)
    logits, target = torch.randn(1, 4, 9), torch.tensor([[4, 5, 6, 0]])
    ours, _ = label_smoothed_loss(logits, target, 0.1, pad_id=0)
    theirs = torch.nn.functional.cross_entropy(
        logits[0], target[0], ignore_index=0, label_smoothing=0.1, reduction="sum"
    )
    assert abs(ours.item() - theirs.item()) > 1e-3


def test_bf16_logits_are_smoothed_in_float32():
    torch.manual_seed(2)
    logits, target = torch.randn(2, 5, 11), torch.randint(1, 11, (2, 5))
    full, _ = label_smoothed_loss(logits, target, 0.1, pad_id=0)
    half, _ = label_smoothed_loss(logits.bfloat16(), target, 0.1, pad_id=0)
    assert half.dtype == torch.float32
    assert half.item() == pytest.approx(full.item(), rel=2e-2)
