"""The schedules are the paper's formulas; the loss is label-smoothed cross-entropy ignoring padding."""

import math

import pytest
import torch

from attnkit.train.losses import label_smoothed_loss
from attnkit.train.schedules import inverse_sqrt, learning_rate_fn, noam


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


def test_unknown_schedule_is_a_config_error():
    from attnkit.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train\.schedule"):
        learning_rate_fn("cosine", 1.0, 100, 512)


def test_label_smoothing_matches_its_definition_and_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7)
    target = torch.tensor([[4, 5, 0], [6, 0, 0]])  # 0 = padding
    eps = 0.1
    loss, nll = label_smoothed_loss(logits, target, eps)
    log_p = logits.log_softmax(-1)
    expected = expected_nll = 0.0
    for b, t in [(0, 0), (0, 1), (1, 0)]:
        y = target[b, t]
        expected += -(1 - eps) * log_p[b, t, y] - eps / 7 * log_p[b, t].sum()
        expected_nll += -log_p[b, t, y]
    assert loss.item() == pytest.approx(float(expected), rel=1e-5)
    assert nll.item() == pytest.approx(float(expected_nll), rel=1e-5)
    assert math.isfinite(loss.item())
