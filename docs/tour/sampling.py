# %% [markdown]
# # Sampling from a language model: temperature and top-p
#
# A GPT-style decoder gives, at each step, a distribution over the next token. Greedy search takes the
# most likely token every time, and its text tends to repeat itself; sampling draws from the
# distribution. Two knobs shape what it draws from: the **temperature** T divides the logits before
# the softmax (T → 0 is greedy, T = 1 the model's own distribution, T > 1 flatter), and **top-p**
# (nucleus sampling, Holtzman et al., 2020) keeps only the smallest set of most likely tokens whose
# probability reaches p, cutting the long tail of unlikely tokens that makes sampled text derail.
#
# This page trains a tiny character-level decoder (attnkit's `decoder` architecture, preset
# `tiny-decoder`) on generated sentences for 500 steps, then looks at one next-token distribution under
# each setting with attnkit's own sampling code (`attnkit.decode.sampling.restrict`, what
# `attnkit generate --temperature --top-p` uses) and samples continuations with `attnkit.decode.generate`.
#
# Run: `python sampling.py` (under a minute on a CPU; writes `sampling.png` into the current folder).

# %%
import dataclasses
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from attnkit.checkpoint.folder import resolve_checkpoint
from attnkit.config import load_run_config
from attnkit.data.synthetic import PLACES, slot_sentences
from attnkit.decode.generate import generate
from attnkit.decode.sampling import restrict
from attnkit.loading import load_for_inference
from attnkit.train.loop import Trainer

torch.set_num_threads(min(2, torch.get_num_threads()))
lines = [f"{sentence}.\n" for sentence in slot_sentences(3000, seed=0)]  # "the cat sat on the mat."
with tempfile.TemporaryDirectory() as work:
    (Path(work) / "text.txt").write_text("".join(lines), encoding="utf-8")
    config = load_run_config(None, [
        "model.arch=decoder", "model.preset=tiny-decoder", "data.task=text", f"data.dir={work}",
        "data.train=[text.txt]", "data.tokenizer=char", "train.max_tokens=2048", "train.schedule=constant",
        "train.lr=0.003", "train.warmup=1", "train.max_steps=500", "train.eval_every=500", "train.seed=1",
        f"data.store={work}/stores",
    ])  # fmt: skip
    Trainer(config, Path(work) / "run", echo=lambda message: None).fit()
    model, tokenizer, config = load_for_inference(resolve_checkpoint(Path(work) / "run"))

# %% [markdown]
# ## One next-token distribution, four ways
#
# After the prompt "the cat sat on the ", the model has learned that a place comes next: its probability
# is spread over the four places' first letters (mat, log, den, box). Temperature sharpens or flattens
# it; top-p cuts it down to the few letters that carry p of the probability.

# %%
PROMPT = "the cat sat on the "
prompt = tokenizer.encode(PROMPT)
with torch.no_grad():
    logits = model(torch.tensor([[tokenizer.specials.bos, *prompt]]))[0, -1]  # (V,) the next token's
log_p = logits.log_softmax(-1)[None]  # (1, V)
shown = {
    "T = 1": log_p.softmax(-1)[0],
    "T = 0.5": (log_p / 0.5).softmax(-1)[0],
    "T = 2": (log_p / 2).softmax(-1)[0],
    "T = 1, top-p 0.6": restrict(log_p, top_p=0.6).softmax(-1)[0],
}
top = shown["T = 1"].topk(8).indices
letters = [repr(tokenizer.decode([int(i)])) for i in top]
for name, p in shown.items():
    entropy = -(p * p.clamp_min(1e-30).log()).sum()
    print(
        f"{name:17s} entropy {entropy:.2f} nats; kept tokens {(p > 0).sum():3d}; top: "
        + ", ".join(f"{letter} {p[i]:.2f}" for letter, i in zip(letters[:5], top[:5], strict=True))
    )

# %% [markdown]
# ## Continuations
#
# Greedy search writes the same sentence every time; sampling at T = 1 writes the kinds of sentence the
# model was trained on, with slips (a model this small, trained for seconds, still gives the bytes it
# never saw some probability); at T = 2 the flattened distribution lets in letters that make no words.

# %%
samples = {}
for temperature in (0.0, 1.0, 2.0):
    decode = dataclasses.replace(
        config.decode, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=24
    )
    samples[temperature] = generate(model, tokenizer, ["the "] * 4, decode, seeds=[1, 2, 3, 4])
    print(f"T = {temperature}: " + " | ".join(repr(text.split(chr(10))[0]) for text in samples[temperature]))

# %% [markdown]
# ## The picture
#
# The probability of the eight most likely next characters after "the cat sat on the ", under each
# setting.

# %%
fig, axis = plt.subplots(figsize=(9, 4))
width = 0.2
for n, (name, p) in enumerate(shown.items()):
    axis.bar([i + n * width for i in range(len(top))], p[top].numpy(), width, label=name)
axis.set_xticks([i + 1.5 * width for i in range(len(top))], letters)
axis.set(xlabel="next character", ylabel="probability", title=f"After {PROMPT!r}")
axis.legend()
fig.tight_layout()
fig.savefig("sampling.png", dpi=120)

# %% [markdown]
# ## The numbers this page states (checked when it runs)
#
# - The four places' first letters ('m', 'l', 'd', 'b') carry over 80% of the next-token probability
#   after "the cat sat on the ".
# - Entropy rises with temperature: T = 0.5 < T = 1 < T = 2.
# - Top-p 0.6 keeps the smallest set of most likely tokens whose probability reaches 0.6, and no other.
# - Temperature 0 is greedy: all four seeds give the same text; at T = 1 they do not all agree.

# %%
p1 = shown["T = 1"]
first_letters = [tokenizer.encode(place[0])[0] for place in PLACES]
assert p1[first_letters].sum() > 0.8, p1[first_letters]


def entropy_of(p: torch.Tensor) -> float:
    return -(p * p.clamp_min(1e-30).log()).sum().item()


assert entropy_of(shown["T = 0.5"]) < entropy_of(p1) < entropy_of(shown["T = 2"])
kept = shown["T = 1, top-p 0.6"] > 0
ordered = p1.sort(descending=True).values
needed = int((ordered.cumsum(0) < 0.6).sum()) + 1  # the smallest top set reaching 0.6
assert kept.sum() == needed and p1[kept].min() >= p1[~kept].max()
assert len(set(samples[0.0])) == 1 and len(set(samples[1.0])) > 1
print(
    "checked: a place comes next; temperature spreads it; top-p keeps the smallest nucleus; T = 0 is greedy"
)
