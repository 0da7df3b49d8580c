# %% [markdown]
# # Why a batch can change an answer, and how attnkit keeps it fixed
#
# Floating-point addition is not associative: `(a + b) + c` and `a + (b + c)` may differ in the last
# bit. A kernel sums in an order chosen by the shape it is given (how many rows, how much padding, how
# many threads), so the same sentence decoded alone and among others may come out a few bits apart,
# and a near tie between two tokens may then go the other way. This page shows the three steps of it:
# a sum in several orders, one row of attention padded to other lengths, and a small translation model
# decoding sentences alone and in a batch, with torch's own kernels and with attnkit's fast path,
# which takes every sum in an order fixed by the sentence alone (see "The same answer whatever the
# batch" in the docs).
#
# Run: `python invariance.py` (about twenty seconds on a CPU; writes `invariance.png` into the
# current folder).

# %%
import dataclasses

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from attnkit import build_transformer
from attnkit.config import load_run_config
from attnkit.cpu.alone import MEMORY, attend_as_alone
from attnkit.data.synthetic import copy
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.translate import translate
from attnkit.loading import inference_precision, ready_for_inference
from attnkit.models.config import TransformerConfig

torch.manual_seed(0)
numbers = torch.randn(10_000) * 100  # float32
orders = [numbers[torch.randperm(len(numbers))] for _ in range(200)]
# each order summed left to right in float32 (numpy's cumsum; torch's accumulates in float64)
sums = torch.tensor([np.cumsum(order.numpy(), dtype=np.float32)[-1] for order in orders])
ulp = torch.finfo(torch.float32).eps * sums.abs().max()
distinct = len(set(sums.tolist()))
print(f"10,000 numbers summed in 200 orders: {distinct} distinct results, "
      f"{(sums.max() - sums.min()) / ulp:.0f} units in the last place apart")  # fmt: skip

# %% [markdown]
# ## One row of attention, padded to other lengths
#
# A sentence of 11 keys, alone and in a batch padded to 12 … 64 keys. The padded keys weigh exactly
# nothing, yet torch's fused kernel (`F.scaled_dot_product_attention`) sums the row's weights and
# values over the padded length, in an order that follows it. attnkit's `attend_as_alone` pads every
# row's keys to a length of its own (the next multiple of 8) and calls the kernel once per group of
# rows of the same length: the same shapes alone and in any batch, so the same bits.

# %%
h, d_k, length = 4, 32, 11
q, k, v = torch.randn(1, h, 1, d_k), torch.randn(1, h, length, d_k), torch.randn(1, h, length, d_k)
alone_mask = torch.ones(1, 1, 1, length, dtype=torch.bool)
torch_alone = F.scaled_dot_product_attention(q, k, v, attn_mask=alone_mask)
ours_alone = attend_as_alone(q, k, v, alone_mask, None, MEMORY)
padded_lengths = list(range(12, 65, 4))
torch_differs, ours_differs = [], []
for padded in padded_lengths:
    others = 5  # batchmates of other lengths
    K, V = torch.randn(others + 1, h, padded, d_k), torch.randn(others + 1, h, padded, d_k)
    K[0, :, :length], V[0, :, :length] = k[0], v[0]
    Q = torch.cat([q, torch.randn(others, h, 1, d_k)])
    mask = (
        torch.arange(padded)[None, :]
        < torch.tensor([length, *torch.randint(1, padded + 1, (others,)).tolist()])[:, None]
    )
    mask = mask[:, None, None, :]  # (B, 1, 1, padded)
    torch_differs.append(
        int(not torch.equal(F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)[:1], torch_alone))
    )
    ours_differs.append(int(not torch.equal(attend_as_alone(Q, K, V, mask, None, MEMORY)[:1], ours_alone)))
print(f"padded to {len(padded_lengths)} other lengths: torch's kernel gave other bits "
      f"{sum(torch_differs)} times, attend_as_alone {sum(ours_differs)}")  # fmt: skip

# %% [markdown]
# ## A translation model, sentence by sentence and in a batch
#
# A small random Transformer (d_model 256) on sentences of 1 to 16 words, beam 4, the two best of each
# with their scores. First with torch's own kernels (the model as built), then loaded the way attnkit's
# commands load it (`ready_for_inference`: the CPU fast path, in bf16 where this CPU has bf16 units,
# and in float32), each sentence decoded alone and among the others. A score is a sum of a sentence's
# log-probabilities: any bit that moved anywhere shows in it. (On processors with AMX tiles, oneDNN sums
# a wide bf16 map's row in an order that depends on how many rows come with it; there attnkit multiplies
# such maps by blocks of 256 inputs, each summed alike: "How attnkit keeps it fixed" in the docs.)

# %%
data = copy(200, seed=3, max_length=16)
texts = list(dict.fromkeys(data.src))[:40]
tokenizer = Tokenizer.train("word", data.src)
settings = TransformerConfig.from_preset("tiny", d_model=256, d_ff=1024, h=4, dropout=0.0)


def differing(model, decode) -> int:
    """How many of the n-best lines (text and score) differ between alone and one batch of all."""
    alone = translate(
        model, tokenizer, texts, dataclasses.replace(decode, batch_size=1), n_best=2, beam_size=4
    )
    batched = translate(
        model, tokenizer, texts, dataclasses.replace(decode, batch_size=len(texts)), n_best=2, beam_size=4
    )
    return sum(
        a != b for mine, theirs in zip(alone, batched, strict=True) for a, b in zip(mine, theirs, strict=True)
    )


counts = {}
for name, precision in [("torch's kernels", None), ("attnkit", "fp32"), ("attnkit", "auto")]:
    torch.manual_seed(7)
    model = build_transformer(settings, tokenizer.vocab_size).eval()
    resolved = inference_precision(precision or "fp32", torch.device("cpu"))[0]  # auto: bf16 where it pays
    config = load_run_config(
        None, ["decode.max_len_a=0", "decode.max_len_b=8", f"decode.precision={resolved}"]
    )
    if precision is not None:
        model = ready_for_inference(model, config)
        name = f"attnkit, {resolved}"
    with torch.no_grad():
        counts[name] = differing(model, config.decode)
    print(f"{name}: {counts[name]} of {2 * len(texts)} n-best lines differ between alone and batched")

# %% [markdown]
# ## The picture
#
# Left: the sums of the same 10,000 numbers in 200 orders (each a dot), in units of the last place
# from their mean. Middle: whether a row's attention came out in other bits when padded to each length.
# Right: the n-best lines of 40 sentences that differed between alone and batched.

# %%
fig, (left, middle, right) = plt.subplots(1, 3, figsize=(13, 3.6))
left.plot(((sums - sums.double().mean().float()) / ulp).numpy(), ".", markersize=3)
left.set(title="one sum, 200 orders", xlabel="order", ylabel="units in the last place")
middle.step(padded_lengths, torch_differs, where="mid", label="F.scaled_dot_product_attention")
middle.step(padded_lengths, ours_differs, where="mid", label="attend_as_alone", linestyle="--")
middle.set(
    title="a row of 11 keys, padded", xlabel="padded length", ylabel="other bits (1 = yes)", ylim=(-0.1, 1.1)
)
middle.legend(fontsize=8)
colours = ["tab:red" if count else "tab:green" for count in counts.values()]  # red: some lines differ
right.bar(list(counts), list(counts.values()), color=colours)
right.set(title="n-best lines that differ", ylabel=f"of {2 * len(texts)}")
right.tick_params(axis="x", labelsize=8)
fig.tight_layout()
fig.savefig("invariance.png", dpi=110)

# %%
assert distinct > 1  # floating-point addition depends on the order
assert sum(ours_differs) == 0  # each row attends as alone, whatever the padding
ours = [name for name in counts if name.startswith("attnkit")]
assert all(counts[name] == 0 for name in ours)
print(f"checked: attnkit's rows the same bits alone and batched ({'; '.join(ours)})")
