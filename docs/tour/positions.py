# %% [markdown]
# # How sinusoidal positions encode order
#
# Attention itself has no notion of order: permute the keys and values together and each query's
# output is the same. The Transformer adds a position vector to each token's embedding (Vaswani et al.,
# 2017, §3.5): `PE(pos, 2i) = sin(pos / 10000^(2i/d_model))`, `PE(pos, 2i+1) = cos(…)`, one sinusoid
# per pair of dimensions, with wavelengths from 2π to 10000·2π. The paper chose it because "for any
# fixed offset k, PE(pos+k) can be represented as a linear function of PE(pos)", so that relative
# positions are easy to attend by.
#
# This page draws attnkit's table (`attnkit.nn.embedding.sinusoid_table`, what `PositionalEncoding`
# adds), measures how the dot product between two positions depends on their distance alone, and
# checks the paper's linear-function claim by fitting that linear map.
#
# Run: `python positions.py` (a few seconds on a CPU; writes `positions.png` into the current folder).

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from attnkit.nn.embedding import sinusoid_table

P, D = 200, 128
table = sinusoid_table(P, D).double()  # (positions, d_model), the paper's interleaved layout
similarity = table @ table.T  # (P, P): PE(p) · PE(q)
print(f"|PE(pos)|² = {table[0].dot(table[0]):.1f} for every position (d_model / 2 = {D // 2})")

# %% [markdown]
# ## Distance, not place
#
# `PE(p)·PE(p+k) = Σ_i cos(k·ω_i)`: the dot product depends on the offset k only, not on where the pair
# sits. It is largest at k = 0 and falls, unevenly, with distance, so nearby positions look alike to an
# attention head that compares queries and keys by their dot product.

# %%
offsets = torch.arange(0, 100)
by_offset = torch.stack([similarity.diagonal(int(k))[: P - 100] for k in offsets])  # (offsets, places)
spread = (by_offset.max(1).values - by_offset.min(1).values).max()
print(f"largest difference between places at the same offset: {spread:.2e}")

# %% [markdown]
# ## A fixed offset is a linear map
#
# For each offset k, the least-squares matrix M_k that sends PE(pos) to PE(pos + k) over every position
# fits exactly: each pair of dimensions (sin, cos) at frequency ω is rotated by the angle k·ω, the same
# for every pos.

# %%
residuals = {}
for k in (1, 5, 25):
    source, target = table[: P - k], table[k:]
    M_k = torch.linalg.lstsq(source, target).solution  # (D, D)
    residuals[k] = (source @ M_k - target).abs().max().item()
    print(f"offset {k:2d}: largest error of PE(pos + {k}) = PE(pos)·M_{k}: {residuals[k]:.1e}")

# %% [markdown]
# ## The picture
#
# Left: the table, one row per position, one column per dimension; the first dimensions turn fast, the
# last barely move over 200 positions. Right: the dot product of position 50 with every other: a peak
# at itself, falling with distance on either side, symmetric.

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
image = left.imshow(table.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
left.set(xlabel="dimension", ylabel="position", title="sinusoid_table(200, 128)")
fig.colorbar(image, ax=left)
right.plot(range(P), similarity[50].numpy())
right.axvline(50, color="grey", linestyle=":")
right.set(xlabel="position q", ylabel="PE(50) · PE(q)", title="Similarity to position 50")
fig.tight_layout()
fig.savefig("positions.png", dpi=120)

# %% [markdown]
# ## The numbers this page states (checked when it runs)
#
# - Every position's vector has squared length d_model / 2 (sin² + cos² = 1 per pair).
# - The dot product of two positions depends on their distance only (within 1e-4: the table is float32).
# - It is largest at distance 0 and symmetric: PE(p)·PE(p+k) = PE(p)·PE(p−k).
# - PE(pos + k) is a linear function of PE(pos) for k = 1, 5, 25 (least-squares error under 1e-4).

# %%
assert torch.allclose(table.pow(2).sum(1), torch.full((P,), D / 2, dtype=torch.float64), atol=1e-4)
assert spread < 1e-4
after, before = similarity[50, 51:100], similarity[50, 1:50].flip(0)  # distances 1 … 49 on either side
assert similarity[50].argmax() == 50 and torch.allclose(after, before, atol=1e-4)
assert all(error < 1e-4 for error in residuals.values()), residuals
print("checked: constant length, distance alone, peak at 0 and symmetric, offsets are linear maps")
