# %% [markdown]
# # Global and local, soft and hard attention
#
# The attention of the Transformer is *global* and *soft*: every query weighs every key, and the output
# is the weighted mean of all the values. Two older questions ask whether it must be.
#
# - **Local** (Luong et al., 2015, §3.2): look only at a window `[p_t − D, p_t + D]` of the source.
#   *local-m* centres it at the target step, `p_t = t` (monotonic alignment); *local-p* predicts the
#   centre, `p_t = S · sigmoid(v_pᵀ tanh(W_p h_t))`, and multiplies the weights by a Gaussian
#   `exp(−(j − p_t)² / 2σ²)`, σ = D/2, which makes `p_t` learnable. Long-context Transformers use the
#   same idea as a sliding window (Longformer, Mistral).
# - **Hard** (Xu et al., 2015): pick one position (sampled while training, trained by REINFORCE; the
#   most likely one when decoding) and take its annotation alone.
#
# This page runs attnkit's RNN decoder attention (`attnkit.models.rnn_attention.SourceAttention`) with
# each setting on the same source and queries (random weights: the shapes, not what a model learns)
# and draws the alignments, and checks attnkit's fast sliding-window attention (`attend_local`, O(T·w))
# against the banded mask on the reference path (O(T²)).
#
# Run: `python local.py` (a few seconds on a CPU; writes `local.png` into the current folder).

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from attnkit.attention.functional import attend_reference
from attnkit.attention.local import attend_local
from attnkit.attention.masks import local_window_mask, padding_mask
from attnkit.models.rnn_attention import SourceAttention

torch.manual_seed(0)
S, T, d, D = 20, 16, 32, 3  # source tokens, target steps, width, window half-width
annotations, src = torch.randn(1, S, d), torch.arange(4, 4 + S)[None]  # one sentence, no padding
queries = torch.randn(T, 1, 1, d)  # one decoder state a step

settings = {
    "global": {},
    "local-m": {"local": "local-m"},
    "local-p": {"local": "local-p"},
    "hard": {"hard": True},
}
alignments, contexts = {}, {}
for name, options in settings.items():
    attention = SourceAttention("dot", d, window=D, **options).eval()  # eval: hard attention's argmax
    source = attention.prepare(annotations, padding_mask(src, 0))
    steps = [attention(queries[t], t, source) for t in range(T)]
    alignments[name] = torch.cat([alignment.weights for _, alignment in steps])  # (T, S)
    contexts[name] = torch.cat([context for context, _ in steps])  # (T, 1, d)
    if attention.hard:  # what the context takes: the one position picked (α's argmax, when decoding)
        alignments[name] = torch.nn.functional.one_hot(alignments[name].argmax(-1), S).float()
    used = (alignments[name] > 0).sum(-1).float().mean()
    print(f"{name:8s} source positions a step: {used:4.1f} of {S}; weights sum to "
          f"{alignments[name].sum(-1).min():.2f} … {alignments[name].sum(-1).max():.2f}")  # fmt: skip

# %% [markdown]
# ## The picture
#
# One row per target step, one column per source position. Global: every position gets some weight.
# local-m: a band of 2D + 1 = 7 positions along the diagonal. local-p: a window around each step's
# predicted centre, fading with the Gaussian. Hard: one position a step (the most likely, when decoding).

# %%
fig, axes = plt.subplots(1, 4, figsize=(14, 3.8))
for axis, (name, weights) in zip(axes, alignments.items(), strict=True):
    axis.imshow(weights.detach().numpy(), cmap="viridis", vmin=0)
    axis.set(title=name, xlabel="source position", ylabel="target step")
fig.tight_layout()
fig.savefig("local.png", dpi=120)

# %% [markdown]
# ## A sliding window in O(T·w)
#
# Scoring all T² pairs and masking all but a band of 2w + 1 per query wastes most of the work on long
# inputs. `attend_local` cuts the queries into blocks of w and scores each block against the 3w keys
# it can see: 3·w·T scores instead of T². Same result.

# %%
B, h, L, w = 2, 4, 512, 32
q, k, v = (torch.randn(B, h, L, 16) for _ in range(3))
blocked = attend_local(q, k, v, w)
banded, _ = attend_reference(q, k, v, local_window_mask(L, window=w))
print(f"T = {L}, w = {w}: {3 * w * L:,} scores in blocks against {L * L:,} for the banded mask; "
      f"largest difference {(blocked - banded).abs().max():.1e}")  # fmt: skip

# %% [markdown]
# ## The numbers this page states (checked when it runs)
#
# - Global soft weights cover every source position and sum to 1.
# - local-m gives no weight outside [t − D, t + D] (with p_t = t, stopped at the last position), and at
#   most 2D + 1 positions a step.
# - local-p's weights sum to at most 1 (the Gaussian takes some away), as in Luong et al.
# - Hard attention's context is exactly one annotation each step.
# - `attend_local` equals the banded mask on the reference path (within 1e-5).

# %%
glob = alignments["global"]
assert (glob > 0).all() and torch.allclose(glob.sum(-1), torch.ones(T), atol=1e-5)
local_m = alignments["local-m"]
for t in range(T):
    centre = min(t, S - 1)
    outside = (torch.arange(S) - centre).abs() > D
    assert (local_m[t, outside] == 0).all() and (local_m[t] > 0).sum() <= 2 * D + 1, t
assert (alignments["local-p"].sum(-1) <= 1 + 1e-6).all()
picked = contexts["hard"][:, 0]  # (T, d)
assert all(any(torch.equal(picked[t], annotations[0, j]) for j in range(S)) for t in range(T))
assert torch.allclose(blocked, banded, atol=1e-5)
print(
    "checked: global covers all, local-m its band, local-p sums to at most 1, hard picks one, blocks = band"
)
