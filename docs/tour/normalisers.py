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
# zero, whether a row sums to 1, whether the keys compete. Then it trains the same one-layer model with
# each to pick one key out of 64, and compares how fast they learn it. How translators trained with each
# compare is measured in [attention variants](../attention_variants.md).
#
# Run: `python normalisers.py` (about 15 seconds on a CPU; writes `normalisers.png` and
# `normalisers_learning.png` into the current folder).

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from torch import nn

from attnkit.attention.multihead import MultiHeadAttention
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
# ## Which learns fastest to pick one key
#
# A task where attention must choose: a memory of 64 (key, value) pairs (keys drawn from 128 symbols,
# values from 64) and a query naming one of the keys; the answer is that key's value. The model is one
# attention head of attnkit's `MultiHeadAttention` (d_model 32) from an embedding of the query to the
# pairs' embeddings (key + value), and a linear layer that reads the value out of what it attended to.
# The same model, data and seed for each normaliser; Adam at 3·10⁻³, 128 memories a step, 600 steps;
# accuracy on 2,000 held-out memories every 60 steps (chance: 1 in 64).
#
# Softmax learns it first and sigmoid close behind; ReLU and GELU get there last. With softmax,
# raising the matching key's score lowers every other weight at once (the competition above); the
# point-wise normalisers must push each score on its own, and ReLU passes no gradient at all to a score
# below zero (GELU very little). Translating dates in [attention variants](../attention_variants.md),
# ReLU, GELU and sigmoid needed 1.7 to 2 times softmax's steps to reach 99%.

# %%
PAIRS, KEY_SYMBOLS, VALUE_SYMBOLS, D_MODEL, STEPS, EVERY = 64, 128, 64, 32, 600, 60


def memories(n: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """``n`` memories: keys and values ``(n, PAIRS)`` (distinct keys), the asked keys and answers ``(n,)``."""
    keys = torch.stack([torch.randperm(KEY_SYMBOLS, generator=generator)[:PAIRS] for _ in range(n)])
    values = torch.randint(VALUE_SYMBOLS, (n, PAIRS), generator=generator)
    asked = torch.randint(PAIRS, (n,), generator=generator)
    rows = torch.arange(n)
    return keys, values, keys[rows, asked], values[rows, asked]


class Recall(nn.Module):
    """One attention head from the query to the memory's pairs, and a read-out of the value."""

    def __init__(self, normaliser: str) -> None:
        super().__init__()
        self.key, self.value = nn.Embedding(KEY_SYMBOLS, D_MODEL), nn.Embedding(VALUE_SYMBOLS, D_MODEL)
        self.query = nn.Embedding(KEY_SYMBOLS, D_MODEL)
        self.attention = MultiHeadAttention(D_MODEL, 1, normaliser=normaliser)
        self.read = nn.Linear(D_MODEL, VALUE_SYMBOLS)

    def forward(self, keys: torch.Tensor, values: torch.Tensor, asked: torch.Tensor) -> torch.Tensor:
        memory = self.key(keys) + self.value(values)  # (n, PAIRS, d_model)
        attended, _ = self.attention(self.query(asked)[:, None], memory)  # (n, 1, d_model)
        return self.read(attended[:, 0])  # (n, VALUE_SYMBOLS)


held_out = memories(2000, torch.Generator().manual_seed(99))
curves = {}
for name in NORMALISERS:
    torch.manual_seed(1)
    model, data = Recall(name), torch.Generator().manual_seed(2)
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    curves[name] = []
    for step in range(1, STEPS + 1):
        *inputs, answers = memories(128, data)
        loss = nn.functional.cross_entropy(model(*inputs), answers)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if step % EVERY == 0:
            with torch.no_grad():
                *inputs, answers = held_out
                curves[name].append((model(*inputs).argmax(-1) == answers).float().mean().item())
    halfway = curves[name][STEPS // EVERY // 2 - 1]
    print(
        f"{name:8s} accuracy after {STEPS // 2} steps {halfway:6.1%}, after {STEPS} {curves[name][-1]:6.1%}"
    )

fig, axis = plt.subplots(figsize=(6, 4))
for name, curve in curves.items():
    axis.plot(range(EVERY, STEPS + 1, EVERY), curve, "o-", markersize=3, label=name)
axis.axhline(1 / PAIRS, color="grey", linestyle=":", label="chance")
axis.set(xlabel="step", ylabel="held-out accuracy", title=f"Picking one key of {PAIRS}")
axis.legend()
fig.tight_layout()
fig.savefig("normalisers_learning.png", dpi=120)

# %% [markdown]
# ## The numbers this page states (checked when it runs)
#
# - Softmax: every weight positive, every row sums to 1 (within 1e-5), and raising one key's score
#   lowers every other key's weight.
# - ReLU: about half the weights exactly zero (scores below 0), none negative.
# - GELU: some weights negative, none below −0.17 / n (GELU's minimum, divided by the n keys).
# - Sigmoid: every weight in (0, 1), rows that do not sum to 1 (their spread is over 0.1).
# - The point-wise normalisers' other weights do not change when one key's score is raised.
# - Picking one key of 64: after 300 steps softmax is right at least half the time and ahead of sigmoid,
#   and both are at least 20 points ahead of ReLU and GELU; after 600 steps every normaliser is right
#   at least half the time.

# %%
softmax_w, relu_w, gelu_w, sigmoid_w = (weights[n] for n in ("softmax", "relu", "gelu", "sigmoid"))
assert (softmax_w > 0).all() and torch.allclose(softmax_w.sum(-1), torch.ones(len(scores)), atol=1e-5)
assert (NORMALISERS["softmax"](raised)[:, 1:] < softmax_w[:, 1:]).all()
assert 0.4 < (relu_w == 0).float().mean() < 0.6 and (relu_w >= 0).all()
assert (gelu_w < 0).any() and gelu_w.min() > -0.17 / KEYS
assert ((sigmoid_w > 0) & (sigmoid_w < 1)).all() and sigmoid_w.sum(-1).std() > 0.1
assert all(moved[name] == 0 for name in ("relu", "gelu", "sigmoid")), moved
halfway = {name: curve[STEPS // EVERY // 2 - 1] for name, curve in curves.items()}
assert halfway["softmax"] >= 0.5 and halfway["softmax"] > halfway["sigmoid"], halfway
assert min(halfway["softmax"], halfway["sigmoid"]) >= max(halfway["relu"], halfway["gelu"]) + 0.2, halfway
assert all(curve[-1] >= 0.5 for curve in curves.values()), curves
print("checked: softmax dense and competitive; ReLU sparse; GELU slightly negative; sigmoid independent;")
print("checked: softmax learns to pick one key first, then sigmoid, then ReLU and GELU")
