# %% [markdown]
# # What BERT's masked language model learns
#
# A decoder (GPT) predicts each token from the ones before it. BERT (Devlin et al., 2019, §3.1) is an
# encoder: every token sees the whole sentence, both sides, so it cannot be trained to predict the next
# token (it would see it). Instead some tokens are hidden and the model predicts them from their
# context. The recipe: choose 15% of the tokens; replace 80% of those by `[MASK]`, 10% by a random
# token and leave 10% as they are, so that the model cannot learn that only `[MASK]` positions matter.
#
# This page measures attnkit's masking (`attnkit.tasks.masked_lm.mask_tokens`) on many sentences, then
# pre-trains a tiny BERT-style encoder (`model.arch=encoder`, preset `tiny-encoder`, `data.task=mlm`) on
# generated sentences in which animals and places have their own slots, and asks it to fill the blank,
# as `attnkit predict` does.
#
# Run: `python masked_lm.py` (under a minute on a CPU; writes `masked_lm.png` into the current folder).

# %%
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from attnkit.checkpoint.folder import resolve_checkpoint
from attnkit.config import load_run_config
from attnkit.data.batching import encoder_input
from attnkit.data.synthetic import ANIMALS, PLACES, VERBS, slot_sentences
from attnkit.loading import load_for_inference
from attnkit.tasks.masked_lm import MaskedLMTask, mask_tokens
from attnkit.train.loop import Trainer

torch.set_num_threads(min(2, torch.get_num_threads()))

# %% [markdown]
# ## The 15%, and the 80/10/10
#
# 2,000 sentences of 30 tokens; `[MASK]` is id 4, the random replacements come from ids 10-99.

# %%
generator = torch.Generator().manual_seed(0)
ids = torch.randint(10, 100, (2000, 30), generator=generator)
inputs, chosen = mask_tokens(ids, torch.ones_like(ids, dtype=torch.bool), 4, torch.arange(10, 100), generator)
shares = {
    "[MASK]": (inputs[chosen] == 4).float().mean().item(),
    "random": ((inputs[chosen] != 4) & (inputs[chosen] != ids[chosen])).float().mean().item(),
    "kept": (inputs[chosen] == ids[chosen]).float().mean().item(),
}
print(
    f"chosen: {chosen.float().mean():.1%} of tokens; of those "
    + ", ".join(f"{k} {v:.1%}" for k, v in shares.items())
)

# %% [markdown]
# (A random replacement draws the same token it replaces 1 time in 90 here, so "kept" is a little over
# 10% and "random" a little under.)
#
# ## Filling the blank
#
# Sentences "the ANIMAL VERB on the PLACE ." for five animals, four verbs and four places. After 400
# steps the encoder has learned which slot takes which kind of word, from both sides of the blank.

# %%
lines = [f"{sentence} ." for sentence in slot_sentences(4000, seed=0)]  # "the cat sat on the mat ."
with tempfile.TemporaryDirectory() as work:
    (Path(work) / "lines.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = load_run_config(None, [
        "model.arch=encoder", "model.preset=tiny-encoder", "data.task=mlm", "data.tokenizer=word",
        "data.vocab_size=100", f"data.dir={work}", "data.train=[lines.txt]", f"data.store={work}/stores",
        "train.schedule=constant", "train.warmup=0", "train.lr=2e-3", "train.label_smoothing=0",
        "train.max_tokens=1024", "train.max_steps=400", "train.eval_every=400", "train.seed=1",
    ])  # fmt: skip
    scores = Trainer(config, Path(work) / "run", echo=lambda message: None).fit()
    model, tokenizer, config = load_for_inference(resolve_checkpoint(Path(work) / "run"))
print(f"held-out masked-token accuracy after 400 steps: {scores['valid_accuracy']:.1%}")
MASK = tokenizer.hf.id_to_token(tokenizer.specials.mask)  # how this vocabulary writes it: "<mask>"
blanks = [f"the {MASK} sat on the mat .", f"the dog {MASK} on the box .", f"the owl hid on the {MASK} ."]
filled = MaskedLMTask.infer(model, tokenizer, config, blanks, "cpu")
for blank, answer in zip(blanks, filled, strict=True):
    token, probability = answer.split("\t")
    print(f"{blank!r}: {token} ({float(probability):.2f})")

# %% [markdown]
# ## The picture
#
# The probability of each kind of word at each blank: the animal slot is filled with animals, the verb
# slot with verbs and the place slot with places. Within a kind the probability is spread about evenly
# (the best guess above has a quarter or a fifth of it): the sentences were drawn at random, so nothing
# in the context says which animal it was.

# %%
kinds = {"animal": ANIMALS, "verb": VERBS, "place": PLACES}
mask_id = tokenizer.specials.mask


def masked_row(blank: str) -> torch.Tensor:
    """``[CLS] words [SEP]`` with the mask id at the blank, as ``attnkit predict`` builds it."""
    before, after = blank.split(MASK)
    ids = [*tokenizer.encode(before.strip()), mask_id, *tokenizer.encode(after.strip())]
    return torch.tensor([encoder_input(ids, tokenizer.specials)[0]])


probabilities = []
with torch.no_grad():
    for blank in blanks:
        row = masked_row(blank)
        p = model(row, select=row == mask_id).float().softmax(-1)[0]  # (V,) at the one mask
        probabilities.append({kind: sum(p[tokenizer.encode(w)[0]].item() for w in words)
                              for kind, words in kinds.items()})  # fmt: skip
fig, axis = plt.subplots(figsize=(8, 3.5))
for n, kind in enumerate(kinds):
    axis.bar([i + 0.25 * n for i in range(len(blanks))], [p[kind] for p in probabilities], 0.25, label=kind)
axis.set_xticks([i + 0.25 for i in range(len(blanks))], blanks, fontsize=8)
axis.set(ylabel="probability", title="What the encoder puts in each blank")
axis.legend(loc="center")
fig.tight_layout()
fig.savefig("masked_lm.png", dpi=120)

# %% [markdown]
# ## The numbers this page states (checked when it runs)
#
# - 15% of the tokens are chosen (within 1 point); of those 80% become `[MASK]`, 10% random, 10% kept
#   (within 2 points).
# - After 400 steps each blank's best guess is a word of the right kind, and that kind takes over 90% of
#   the probability.

# %%
assert abs(chosen.float().mean().item() - 0.15) < 0.01
for share, expected in zip(shares.values(), (0.8, 0.1, 0.1), strict=True):
    assert abs(share - expected) < 0.02, shares
for answer, kind, p in zip(filled, kinds, probabilities, strict=True):
    assert answer.split("\t")[0] in kinds[kind] and p[kind] > 0.9, (answer, p)
print("checked: BERT's 15% and 80/10/10; the encoder fills each blank with a word of the right kind")
