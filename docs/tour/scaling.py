# %% [markdown]
# # Why the scores are divided by √d_k
#
# Scaled dot-product attention (Vaswani et al., 2017, §3.2.1) weighs the values by
# `softmax(qᵀk / √d_k)`. The paper's footnote says why: if the components of q and k are independent
# with mean 0 and variance 1, their dot product has variance d_k, so for wide heads the raw scores are
# large, the softmax saturates (one key takes nearly all the weight) and its gradients vanish.
#
# This page measures that with attnkit's own scores and softmax (`attnkit.attention.scores`,
# `attnkit.attention.normalisers`, the pieces of its reference attention path): for head widths
# d_k = 4 … 1024, the spread of the raw dot products, the entropy of the weights (how many keys a query
# really looks at; at most log 64 ≈ 4.16 nats for 64 keys), and the gradient the softmax passes back to
# the scores, with the scale (`scaled_dot`) and without it (`dot`).
#
# Run: `python scaling.py` (a few seconds on a CPU; writes `scaling.png` into the current folder).

# %%
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from attnkit.attention.normalisers import softmax
from attnkit.attention.scores import SCORES

torch.manual_seed(0)
WIDTHS = [4, 16, 64, 256, 1024]
QUERIES, KEYS, D_V = 256, 64, 64  # values of one width, so that only the scores change with d_k


def measure(score: str, d_k: int) -> dict[str, float]:
    """Score spread, weight entropy, and the gradient the softmax passes back to the scores, for random
    unit-variance q, k, v."""
    q, k, v = torch.randn(QUERIES, d_k), torch.randn(KEYS, d_k), torch.randn(KEYS, D_V)
    scores = SCORES[score](q, k).requires_grad_()  # (queries, keys): qᵀk / √d_k, or qᵀk
    weights = softmax(scores)
    (weights @ v).sum().backward()  # the output, and what reaches each score through the softmax
    entropy = -(weights * weights.clamp_min(1e-30).log()).sum(-1).mean()
    return {"std": (q @ k.T).std().item(), "entropy": entropy.item(),
            "grad": scores.grad.norm(dim=-1).median().item()}  # fmt: skip


results = {score: [measure(score, d) for d in WIDTHS] for score in ("scaled_dot", "dot")}
for score, rows in results.items():
    for d, row in zip(WIDTHS, rows, strict=True):
        print(
            f"{score:10s} d_k={d:5d}  std(qᵀk)={row['std']:6.1f}  entropy={row['entropy']:.2f} nats  "
            f"|∂out/∂scores|={row['grad']:.3g}"
        )

# %% [markdown]
# ## The picture
#
# Left: the entropy of each query's weights. With the scale it stays near its level at d_k = 4 for
# every width: a query spreads its attention over several keys however wide the head. Without it the
# entropy falls towards 0 as d_k grows: each query puts nearly all its weight on one key. Right: the
# gradient that the softmax passes back to the scores (what training moves them by). Without the scale
# it vanishes as the softmax saturates (the median query's, at d_k = 1024, is thousands of times
# smaller); with it, it stays of the same size.

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
for score, label in (("scaled_dot", "qᵀk / √d_k (the paper)"), ("dot", "qᵀk (unscaled)")):
    left.plot(WIDTHS, [r["entropy"] for r in results[score]], "o-", label=label)
    right.plot(WIDTHS, [r["grad"] for r in results[score]], "o-", label=label)
left.axhline(math.log(KEYS), color="grey", linestyle=":", label=f"uniform over {KEYS} keys")
left.set(xscale="log", xlabel="d_k", ylabel="entropy of the weights (nats)", title="How spread out")
right.set(
    xscale="log",
    yscale="log",
    xlabel="d_k",
    ylabel="median |∂ output / ∂ scores|",
    title="Gradient through the softmax",
)
for axis in (left, right):
    axis.legend()
fig.tight_layout()
fig.savefig("scaling.png", dpi=120)

# %% [markdown]
# ## The numbers this page states (checked when it runs)
#
# - The unscaled scores' standard deviation is √d_k (within 10%): 32 at d_k = 1024.
# - With the scale, the entropy at d_k = 1024 is within 10% of its value at d_k = 4.
# - With the scale, the median gradient that reaches the scores stays within a factor of 2 across widths.
# - Without it, the entropy at d_k = 1024 is under a quarter of the scaled one, and the median gradient
#   that reaches the scores under a hundredth of the scaled one: most queries' softmax is saturated.

# %%
for d, row in zip(WIDTHS, results["dot"], strict=True):
    assert abs(row["std"] / math.sqrt(d) - 1) < 0.1, (d, row["std"])
scaled, unscaled = results["scaled_dot"], results["dot"]
assert abs(scaled[-1]["entropy"] / scaled[0]["entropy"] - 1) < 0.1
assert unscaled[-1]["entropy"] < scaled[-1]["entropy"] / 4
grads = [row["grad"] for row in scaled]
assert max(grads) < 2 * min(grads), grads
assert unscaled[-1]["grad"] < scaled[-1]["grad"] / 100
print("checked: the variance grows as d_k; the scale keeps entropy and gradient; without it both collapse")
