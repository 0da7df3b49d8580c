# %% [markdown]
# # What a mask does to the attention weights
#
# A batch holds sentences of different lengths, padded to the longest; a decoder must not look at the
# words it has yet to write. Both are said with a mask: a boolean per (query, key), `True` where the
# query may attend (attnkit's one convention, the same as `F.scaled_dot_product_attention`'s; see
# `attnkit.attention.masks`). A masked key gets exactly zero weight, and the others share all of it.
#
# This page builds a padding mask and a causal mask for a small batch with attnkit's own functions,
# combines them (the decoder's target mask), runs attnkit's attention (`attend`, which picks the fused
# kernel where it can, and `attend_reference`, the path that reads like the maths), and shows the
# weights. It also asks what happens to a query that may attend to nothing at all: a row of zeros, never
# NaN, on both paths.
#
# Run: `python masks.py` (a few seconds on a CPU; writes `masks.png` into the current folder).

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from attnkit.attention.functional import attend, attend_reference
from attnkit.attention.masks import causal_mask, padding_mask, target_mask

torch.manual_seed(0)
PAD = 0
ids = torch.tensor([[5, 8, 3, 9, 4, 7], [6, 2, 9, PAD, PAD, PAD]])  # two sentences, the second padded
B, T, d_k = ids.size(0), ids.size(1), 16
q, k, v = torch.randn(B, T, d_k), torch.randn(B, T, d_k), torch.randn(B, T, d_k)

masks = {
    "padding (encoder)": padding_mask(ids, PAD),  # (B, 1, T): every query, the real keys
    "causal": causal_mask(T),  # (T, T): each query, itself and the keys before it
    "padding and causal (decoder)": target_mask(ids, PAD),  # (B, T, T)
}
weights = {name: attend_reference(q, k, v, mask, need_weights=True)[1] for name, mask in masks.items()}
for name, w in weights.items():
    print(f"{name}: weights of sentence 2, query 1: {[round(x, 3) for x in w[1, 0].tolist()]}")

# %% [markdown]
# ## The picture
#
# The second sentence's weights under each mask (rows: queries, columns: keys). Under the padding
# mask the three padded keys get no weight; under the causal mask each row stops at the diagonal; the
# decoder's mask does both. The padded queries (rows 4-6) still attend to the real keys: their outputs
# are computed and then ignored by the loss, which skips padded targets.

# %%
fig, axes = plt.subplots(1, 3, figsize=(12, 4))
tokens = ["w1", "w2", "w3", "pad", "pad", "pad"]
for axis, (name, w) in zip(axes, weights.items(), strict=True):
    axis.imshow(w[1].numpy(), cmap="viridis", vmin=0, vmax=1)
    axis.set(title=name, xticks=range(T), yticks=range(T), xticklabels=tokens, yticklabels=tokens,
             xlabel="key", ylabel="query")  # fmt: skip
    for i in range(T):
        for j in range(T):
            shade = "black" if w[1, i, j] > 0.6 else "white"
            axis.text(j, i, f"{w[1, i, j]:.2f}", ha="center", va="center", color=shade, fontsize=7)
fig.tight_layout()
fig.savefig("masks.png", dpi=120)

# %% [markdown]
# ## A query with nothing to attend to
#
# A softmax over no keys is 0/0. attnkit gives such a query zero weights and a zero output on both
# paths, so one empty row (a fully padded sentence, a window with no key in it) cannot turn a batch's
# loss into NaN.

# %%
nothing = torch.zeros(1, T, T, dtype=torch.bool)
nothing[0, 1:] = causal_mask(T)[1:]  # query 0 may attend to no key at all
fused, _ = attend(q[:1], k[:1], v[:1], nothing)
reference, reference_weights = attend_reference(q[:1], k[:1], v[:1], nothing, need_weights=True)
print(
    "query 0's output, fused path:", fused[0, 0, :4].tolist(), "…; all zero:", bool((fused[0, 0] == 0).all())
)

# %% [markdown]
# ## The numbers this page states (checked when it runs)
#
# - Masked keys get exactly 0 weight and every row with an attendable key sums to 1 (within 1e-6).
# - The fused path (`F.scaled_dot_product_attention`) and the reference path give the same outputs
#   (within 1e-5) under every mask.
# - A query with no attendable key gets all-zero weights and output, with no NaN, on both paths.

# %%
for name, mask in masks.items():
    w = weights[name]
    allowed = mask.expand(B, T, T)
    assert (w[~allowed] == 0).all(), name
    assert torch.allclose(w.sum(-1), torch.ones(B, T), atol=1e-6), name
    fast, _ = attend(q, k, v, mask)
    slow, _ = attend_reference(q, k, v, mask)
    assert torch.allclose(fast, slow, atol=1e-5), name
assert not fused.isnan().any() and not reference.isnan().any()
assert (fused[0, 0] == 0).all() and (reference[0, 0] == 0).all() and (reference_weights[0, 0] == 0).all()
assert torch.allclose(fused, reference, atol=1e-5)
print("checked: masked keys get no weight, rows sum to 1, both paths agree, an empty row is zeros")
