# %% [markdown]
# # Speculative decoding, several tokens a step: the model's own answer
#
# Decoding writes one token a step, and on a CPU a step for one sentence costs about what reading the
# weights costs, whether it scores one new position or five. Speculative decoding (Leviathan et al.,
# 2023; Chen et al., 2023) lets something cheap *draft* the next few tokens and has the model score
# them all in one step; the sentence keeps those the model would have written itself. This page shows
# why the answer stays the model's own, for sampling (the acceptance rule, drawn on a small
# vocabulary) and for greedy search (a small translation model whose outputs are compared token for
# token), and how many tokens a step it gives as the drafts get better.
#
# Run: `python speculative.py` (about ten seconds on a CPU; writes `speculative.png` into the current
# folder).

# %%
import itertools

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from attnkit import build_transformer
from attnkit.data.batching import pad
from attnkit.data.synthetic import copy
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.search import Search, argmax, extend, starts_of
from attnkit.decode.speculative import Speculation, speculative_search
from attnkit.decode.speculative_sampling import kept_by_sampling
from attnkit.models.config import TransformerConfig

# %% [markdown]
# ## Sampling: keep a drafted token with probability min(1, p/q)
#
# The draft drew token x from its distribution q; the model's is p. The rule keeps x with probability
# min(1, p(x)/q(x)); where it refuses, it draws instead from the *residual* max(0, p − q), normalised.
# A token then comes out either as the draft's and kept, with probability min(p, q), or from the
# residual, with probability max(0, p − q) (the chance of a refusal is exactly the residual's total):
# min(p, q) + max(0, p − q) = p, whatever q is. Below, a model and a draft that disagree on six
# tokens, 20,000 draws, and the share of each token that came out.

# %%
p = torch.tensor([0.05, 0.30, 0.25, 0.20, 0.15, 0.05], dtype=torch.float64)  # the model's
q = torch.tensor([0.40, 0.10, 0.10, 0.05, 0.05, 0.30], dtype=torch.float64)  # the draft's
generator = torch.Generator().manual_seed(0)
draws = 20_000
out = []
for _ in range(draws):
    drafted = int(torch.multinomial(q, 1, generator=generator))
    out.append(kept_by_sampling(torch.stack([p, p]), q[None], [drafted], generator)[0])
shares = torch.bincount(torch.tensor(out), minlength=len(p)).double() / draws
chi2 = float(((shares - p) ** 2 / p).sum() * draws)
print("token          " + " ".join(f"{i:>6}" for i in range(len(p))))
for name, row in [("model p", p), ("draft q", q), ("min(p, q)", torch.minimum(p, q)), ("came out", shares)]:
    print(f"{name:<14} " + " ".join(f"{x:6.3f}" for x in row))
print(f"chi-square against p over {draws:,} draws: {chi2:.1f} (5 degrees of freedom: 20.5 at p = 0.001)")

# %% [markdown]
# ## Greedy search: keep drafted tokens while they are the model's own choice
#
# For greedy search the rule is simpler: a drafted token is kept where it is the token the model
# scores highest at that position, and the step adds the model's own choice after the last one kept.
# That is exact only if each checked position gets the very scores a step of one token would give it:
# attnkit's check attends each position's query as that step would (`Seq2SeqDecoding.checked_logits`).
# A small random translation model decodes 24 sentences plainly, then with drafts that know its answer
# but spoil each drafted token with a chance from 0 to 1: drafts of every quality, from perfect to
# useless, standing in for a real draft (the source's tokens, or `attnkit distill-draft`'s one-layer
# draft decoder, which guessed 84% of a Multi30k model's tokens).

# %%
data = copy(400, seed=5, max_length=12)
tokenizer = Tokenizer.train("word", data.src)
torch.manual_seed(11)
config = TransformerConfig.from_preset("tiny", d_model=64, d_ff=128, h=2, decoder_layers=1, dropout=0.0)
model = build_transformer(config, tokenizer.vocab_size).eval()
specials = tokenizer.specials
sources = [[*ids, specials.eos] for ids in tokenizer.encode_batch(copy(24, seed=99, max_length=12).src)]
src = pad(sources, specials.pad)
start, limits = starts_of(src, specials, Search(max_len_a=1.0, max_len_b=3))
with torch.no_grad():
    plain = extend(model.decoding(src), start, limits, specials, argmax)


class Spoiled:
    """Drafts of greedy search's own answer, each token spoilt (replaced) with chance ``spoil``."""

    def __init__(self, spoil: float, seed: int) -> None:
        self.spoil, self.rng = spoil, torch.Generator().manual_seed(seed)

    def propose(self, rows, written, lengths, tokens):
        drafts = []
        for r, length in zip(rows, lengths, strict=True):
            answer = [*plain[r], specials.eos][len(written[r]) : len(written[r]) + length]
            spoilt = torch.rand(len(answer), generator=self.rng) < self.spoil
            drafts.append([4 + (t + 1) % 9 if s else t for t, s in zip(answer, spoilt.tolist(), strict=True)])
        return drafts

    def checked(self, kept):
        pass

    def keep(self, index):
        pass


spoils = [0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0]
per_step, same = [], []
for spoil in spoils:
    counts = Speculation()
    with torch.no_grad():
        found = speculative_search(
            model.decoding(src), start, limits, specials, Spoiled(spoil, 1), counts, 24
        )
    same.append(found == plain)
    per_step.append(counts.per_step)
    print(f"drafts spoilt {spoil:.0%}: {counts.acceptance:5.1%} of drafted tokens kept, "
          f"{counts.per_step:.2f} tokens a step, every output plain greedy's: {found == plain}")  # fmt: skip

# %% [markdown]
# ## The picture
#
# Left: the model's distribution, the draft's, and what the rule let out, token by token. Right:
# tokens a sentence gets a step as the drafts worsen; each step costs about one plain step, so this
# is the saving in steps (a draft refused outright pauses its sentence's drafting, so useless drafts
# cost nearly nothing).

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
x = torch.arange(len(p))
left.bar(x - 0.27, p, width=0.27, label="model p")
left.bar(x, q, width=0.27, label="draft q")
left.bar(x + 0.27, shares, width=0.27, label="came out")
left.set(title="speculative sampling's rule", xlabel="token", ylabel="probability")
left.legend()
right.plot([1 - s for s in spoils], per_step, "o-")
right.axhline(1.0, color="grey", linestyle=":", label="plain greedy")
right.set(title="greedy: tokens a step", xlabel="share of drafted tokens right", ylabel="tokens a step")
right.legend()
fig.tight_layout()
fig.savefig("speculative.png", dpi=120)

# %%
assert chi2 < 20.5, chi2  # the rule gives p (a correct rule fails this once in a thousand draws)
assert all(same)  # every output of every draft quality is plain greedy's
assert per_step[0] > 3 and per_step[-1] < 1.1  # perfect drafts: several tokens a step; useless: one
assert all(a >= b - 0.05 for a, b in itertools.pairwise(per_step))  # fewer as drafts worsen
print(f"checked: the rule gives the model's distribution (chi-square {chi2:.1f}); greedy outputs equal "
      f"plain greedy's for drafts of every quality, {per_step[0]:.1f} tokens a step with perfect "
      "drafts")  # fmt: skip
