"""REINFORCE: training a choice that cannot be back-propagated through (Williams, 1992).

Hard attention samples *one* position (Xu et al., 2015, "Show, Attend and Tell", §4.1) or one glimpse
location (Mnih et al., 2014, "Recurrent Models of Visual Attention") instead of averaging over all of
them. The sample is discrete, so no gradient flows to the parameters that chose it; the score-function
estimator gives one anyway:

    ∇ E_{s ~ p}[R(s)] = E_{s ~ p}[(R(s) - b) ∇ log p(s)]

for any baseline ``b`` that does not depend on ``s``. A good ``b`` (here a moving average of past rewards,
as in both papers) leaves the gradient unbiased and cuts its variance. The *surrogate* loss
``-(R - b)·log p(s)`` (``R`` and ``b`` held constant) has exactly that gradient, so autograd does the rest.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def reinforce_loss(log_prob: Tensor, reward: Tensor, baseline: Tensor | float) -> Tensor:
    """The surrogate ``-Σ (R - b) log p(s)``: its gradient is minus the REINFORCE estimate of ``∇E[R]``.

    ``log_prob`` holds the log-probabilities of the sampled choices, ``reward`` their rewards (same shape
    or broadcastable); rewards and baseline are constants (detached): only the choice is trained here.
    """
    advantage = (reward - baseline).detach()
    return -(advantage * log_prob).sum()


class MovingAverageBaseline(nn.Module):
    """``b ← decay·b + (1 - decay)·mean(R)``, started at the first batch's mean reward.

    A buffer, so it is saved in checkpoints and a resumed run goes on with the same baseline.
    """

    def __init__(self, decay: float = 0.9) -> None:
        super().__init__()
        self.decay = decay
        self.register_buffer("value", torch.tensor(float("nan")))

    @torch.no_grad()
    def update(self, reward: Tensor) -> Tensor:
        """The baseline to use for ``reward`` (the value *before* this batch), then fold the batch in."""
        mean = reward.float().mean()
        if torch.isnan(self.value):
            self.value.copy_(mean)
        before = self.value.clone()
        self.value.mul_(self.decay).add_((1.0 - self.decay) * mean)
        return before
