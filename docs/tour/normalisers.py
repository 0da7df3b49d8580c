# %% [markdown]
# # Softmax and the normalisers that replace it
#
# Softmax turns a query's scores into weights that are positive and sum to 1: every key gets some
# weight, and the keys compete (raising one score lowers every other weight). Recent work replaces it
# with a point-wise function of each score alone: ReLU or GELU divided by the number of keys (Wortsman
# et al., 2023), or a sigmoid with a bias of −log n (Ramapuram et al., 2024). attnkit has all four
# (`attnkit.attention.normalisers`, `model.attention_normaliser=relu|gelu|sigmoid`).
#
# This page feeds the same scores to each and compares the weights they give: how many are exactly
# zero, whether a row sums to 1, whether the keys compete. How models trained with each compare on a
# task is measured in [attention variants](../attention_variants.md).
#
# Run: `python normalisers.py` (a few seconds on a CPU; writes `normalisers.png` into the current folder).

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from attnkit.attention.normalisers import NORMALISERS

torch.manual_seed(0)
KEYS = 32
scores = torch.randn(2000, KEYS) * 2  # 2,000 queries' scores over 32 keys
weights = {name: normalise(scores) for name, normalise in NORMALISERS.items()}
for name, w in weights.items():
    print(f"{name:8s} exact zeros {(w == 0).float().mean():5.1%}  negative {(w < 0).float().mean():5.1%}  "
          f"row sums {w.sum(-1).mean():.2f} ± {w.sum(-1).std():.2f}")  # fmt: skip

# %% [markdown]
# ## Do the keys compete?
#
# Raise one key's score by 3 and see what happens to the weight of every other key of the same query:
# under softmax they all fall (the weights must still sum to 1), under the point-wise normalisers they
# do not move: each weight depends on its own score alone.

# %%
raised = scores.clone()
raised[:, 0] += 3
moved = {name: (normalise(raised)[:, 1:] - weights[name][:, 1:]).abs().max().item()
         for name, normalise in NORMALISERS.items()}  # fmt: skip
for name, change in moved.items():
    print(f"{name:8s} largest change of another key's weight: {change:.3f}")

# %% [markdown]
# ## The picture
#
# Left: the distribution of the weights each normaliser gives the same scores (log scale). Right: one
# query's weights over its 32 keys. Softmax is dense and positive; ReLU sets about half the keys to
# exactly zero; GELU lets some weights go slightly negative; sigmoid gives each key a weight of its own
# that need not sum to 1 with the others.

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
for name, w in weights.items():
    left.hist(w.flatten().numpy(), bins=80, histtype="step", label=name, log=True)
    right.plot(w[0].numpy(), "o-", markersize=3, label=name)
left.set(xlabel="weight", ylabel="how many (log)", title="Weights of the same scores")
right.set(xlabel="key", ylabel="weight", title="One query's weights")
for axis in (left, right):
    axis.legend()
fig.tight_layout()
fig.savefig("normalisers.png", dpi=120)

# %% [markdown]
# ## The numbers this page states (checked when it runs)
#
# - Softmax: every weight positive, every row sums to 1 (within 1e-5), and raising one key's score
#   lowers every other key's weight.
# - ReLU: about half the weights exactly zero (scores below 0), none negative.
# - GELU: some weights negative, none below −0.17 / n (GELU's minimum, divided by the n keys).
# - Sigmoid: every weight in (0, 1), rows that do not sum to 1 (their spread is over 0.1).
# - The point-wise normalisers' other weights do not change when one key's score is raised.

# %%
softmax_w, relu_w, gelu_w, sigmoid_w = (weights[n] for n in ("softmax", "relu", "gelu", "sigmoid"))
assert (softmax_w > 0).all() and torch.allclose(softmax_w.sum(-1), torch.ones(len(scores)), atol=1e-5)
assert (NORMALISERS["softmax"](raised)[:, 1:] < softmax_w[:, 1:]).all()
assert 0.4 < (relu_w == 0).float().mean() < 0.6 and (relu_w >= 0).all()
assert (gelu_w < 0).any() and gelu_w.min() > -0.17 / KEYS
assert ((sigmoid_w > 0) & (sigmoid_w < 1)).all() and sigmoid_w.sum(-1).std() > 0.1
assert all(moved[name] == 0 for name in ("relu", "gelu", "sigmoid")), moved
print("checked: softmax is dense and competitive; ReLU sparse; GELU slightly negative; sigmoid independent")
