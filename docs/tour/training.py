# %% [markdown]
# # Warm-up and label smoothing: how the paper trains
#
# Two choices of the paper's §5 that people look up. **The learning rate** (eq. 3) rises linearly for
# `warmup_steps` and then falls as the inverse square root of the step:
# `lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)`. Adam's early steps rest on
# estimates of the gradient's moments made from few samples, and post-LN Transformers diverge when a
# large rate meets them; the warm-up waits until those estimates settle. **Label smoothing** (§5.4,
# ε_ls = 0.1) trains towards `1 - ε` on the reference token and spreads `ε` over the others: the paper
# says it "hurts perplexity, as the model learns to be more unsure, but improves accuracy and BLEU".
#
# This page draws attnkit's schedule (`attnkit.train.schedules.noam`) for the paper's two models, and
# shows what label smoothing asks of a model: it trains free logits with attnkit's loss
# (`attnkit.tasks.losses.label_smoothed_loss`) for ε = 0, 0.1 and 0.3 and reads the probability they
# settle on for the reference token.
#
# Run: `python training.py` (a few seconds on a CPU; writes `training.png` into the current folder).

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from attnkit.tasks.losses import label_smoothed_loss
from attnkit.train.schedules import noam

STEPS, WARMUP = 100_000, 4000
steps = range(1, STEPS + 1, 100)
rates = {d_model: [noam(s, d_model, WARMUP) for s in steps] for d_model in (512, 1024)}
peak_step = max(range(1, 20_001), key=lambda s: noam(s, 512, WARMUP))
print(f"paper-base (d_model 512): peak {noam(WARMUP, 512, WARMUP):.2e} at step {peak_step}, "
      f"{noam(100_000, 512, WARMUP):.2e} at step 100,000")  # fmt: skip

# %% [markdown]
# ## What label smoothing asks for
#
# A vocabulary of 1,000 tokens (`<pad>` at id 0, never predicted), one reference token. Free logits
# trained by Adam to minimise the smoothed loss settle where its gradient is zero: on the smoothed
# distribution itself, `1 - ε` on the reference. Without smoothing (ε = 0) the probability goes to 1
# and the logits grow without bound; with it, the model is taught to keep some doubt.

# %%
V, PAD, REFERENCE = 1000, 0, 7
settled = {}
for epsilon in (0.0, 0.1, 0.3):
    logits = torch.zeros(1, 1, V, requires_grad=True)
    optimizer = torch.optim.Adam([logits], lr=0.1)
    for _ in range(1500):
        optimizer.zero_grad()
        loss, _ = label_smoothed_loss(logits, torch.tensor([[REFERENCE]]), epsilon, PAD)
        loss.backward()
        optimizer.step()
    probabilities = logits.detach().softmax(-1)[0, 0]
    others = torch.cat(
        [probabilities[1:REFERENCE], probabilities[REFERENCE + 1 :]]
    )  # real, not the reference
    settled[epsilon] = (probabilities[REFERENCE].item(), logits.detach().max().item(), others)
    print(f"ε = {epsilon}: p(reference) = {settled[epsilon][0]:.4f}, largest logit {settled[epsilon][1]:.1f}")

# %% [markdown]
# ## The picture
#
# Left: the paper's schedule for paper-base (d_model 512) and paper-big (1024), warm-up 4,000 steps:
# a linear rise, a peak at step 4,000, then a slow fall. Right: the probability of the reference token
# that the smoothed loss settles on, against ε: `1 - ε`.

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
for d_model, values in rates.items():
    left.plot(list(steps), values, label=f"d_model {d_model}")
left.axvline(WARMUP, color="grey", linestyle=":", label="warm-up ends")
left.set(xlabel="step", ylabel="learning rate", title="noam(step, d_model, warmup=4000)")
left.legend()
epsilons = list(settled)
right.plot(epsilons, [settled[e][0] for e in epsilons], "o", label="trained with attnkit's loss")
right.plot([0, 0.3], [1, 0.7], ":", color="grey", label="1 − ε")
right.set(xlabel="ε (label smoothing)", ylabel="p(reference token)", title="Where training settles")
right.legend()
fig.tight_layout()
fig.savefig("training.png", dpi=120)

# %% [markdown]
# ## The numbers this page states (checked when it runs)
#
# - The rate peaks at the end of the warm-up, at d_model^-0.5 · warmup^-0.5 (7.0e-4 for paper-base).
# - At step 4·warmup it is half the peak (the inverse square root).
# - Trained with smoothing ε, the reference's probability settles at 1 − ε (within 0.01), the other
#   real tokens sharing ε equally; without smoothing it goes above 0.999.

# %%
peak = noam(WARMUP, 512, WARMUP)
assert peak_step == WARMUP and abs(peak - 512**-0.5 * WARMUP**-0.5) < 1e-12
assert abs(noam(4 * WARMUP, 512, WARMUP) / peak - 0.5) < 1e-9
assert settled[0.0][0] > 0.999
for epsilon in (0.1, 0.3):
    reference, _, others = settled[epsilon]
    assert abs(reference - (1 - epsilon)) < 0.01, (epsilon, reference)
    assert abs(others.sum().item() - epsilon) < 0.01 and others.std() < 1e-3 * others.mean(), epsilon
print("checked: the warm-up peaks at its end and decays as 1/√step; smoothing settles at 1 − ε")
