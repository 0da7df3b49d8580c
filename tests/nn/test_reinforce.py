"""REINFORCE: the surrogate's gradient is Williams' estimator, and it learns a bandit; the moving-average
baseline starts at the first mean and decays as defined."""

import torch

from attnkit.nn.reinforce import MovingAverageBaseline, reinforce_loss


def test_the_surrogate_gradient_is_minus_advantage_times_grad_log_p():
    """For p = softmax(θ): ∇_θ log p(a) = onehot(a) - p, so ∇ surrogate = -Σ_n (R_n - b)(onehot(a_n) - p)."""
    theta = torch.tensor([0.3, -0.2, 0.5, 0.0], dtype=torch.float64, requires_grad=True)
    actions = torch.tensor([0, 2, 2, 3])
    rewards = torch.tensor([1.0, 0.5, -1.0, 2.0], dtype=torch.float64)
    baseline = 0.25
    reinforce_loss(theta.log_softmax(-1)[actions], rewards, baseline).backward()
    p = theta.detach().softmax(-1)
    expected = -sum(
        (r - baseline) * (torch.nn.functional.one_hot(a, 4) - p)
        for a, r in zip(actions, rewards, strict=True)
    )
    torch.testing.assert_close(theta.grad, expected)


def test_reinforce_learns_the_best_arm_of_a_bandit():
    torch.manual_seed(0)
    theta = torch.zeros(4, requires_grad=True)
    optimiser = torch.optim.SGD([theta], lr=0.1)
    baseline = MovingAverageBaseline()
    mean_reward = torch.tensor([0.1, 0.2, 0.9, 0.3])
    for _ in range(300):
        arms = torch.multinomial(theta.softmax(-1), 32, replacement=True)
        reward = mean_reward[arms] + 0.1 * torch.randn(32)
        optimiser.zero_grad()
        reinforce_loss(theta.log_softmax(-1)[arms], reward, baseline.update(reward)).backward()
        optimiser.step()
    assert theta.softmax(-1)[2] > 0.9
    assert 0.8 < baseline.value < 0.95  # the baseline follows the reward being earned


def test_the_baseline_starts_at_the_first_mean_and_then_decays():
    baseline = MovingAverageBaseline(decay=0.9)
    assert baseline.update(torch.tensor([1.0, 3.0])) == 2.0  # the first batch: its own mean
    assert baseline.update(torch.tensor([12.0])) == 2.0  # the value before this batch
    assert baseline.value.item() == 0.9 * 2.0 + 0.1 * 12.0
    assert "value" in baseline.state_dict()  # saved with the model: a resumed run keeps it
