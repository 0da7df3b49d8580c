"""The captioners, the speech recogniser and the RNN translation models decode each input as they would
alone (docs/invariance.md): the logits of every decoding step are the same bits whatever the batch,
its order and its batchmates' lengths, in every precision; the Transformer's are in
test_batch_invariance.py."""

from __future__ import annotations

import random

import pytest
import torch

from attnkit.config import load_run_config
from attnkit.data.batching import pad
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.beams import beam
from attnkit.decode.search import Hypothesis, Search
from attnkit.decode.transcripts import padded_frames
from attnkit.loading import ready_for_inference
from attnkit.models import build_model, from_preset

PRECISIONS = ["fp32", "bf16", "int8"]
N = 10  # inputs, decoded alone and in batches
# each model with the attention its recipes use and others that sum in other ways: Luong's concat
# (its own products), location-aware (a convolution of the last weights), median windows
MODELS = [
    ("captioner-small", {}),
    ("caption-transformer-small", {}),
    ("las-small", {}),
    ("rnn-small", {}),
    ("rnn-small", {"attention": "concat", "cell": "gru"}),
    ("rnn-small", {"attention": "location", "local": "median", "layers": 2}),
]


def _tokenizer() -> Tokenizer:
    return Tokenizer.train("char", ["a man is riding a horse", "two dogs play in the snow"])


def _ready(preset: str, overrides: dict, precision: str, vocab_size: int):
    torch.manual_seed(0)
    config = from_preset(preset, max_len=20, **overrides)
    model = build_model(config, vocab_size).eval()
    return ready_for_inference(model, load_run_config(None, [f"decode.precision={precision}"])), config


def _inputs(preset: str, config, tokenizer: Tokenizer):
    """``N`` inputs for the model and a function that batches some of them: images of one size;
    utterances and sources of mixed lengths, padded as decoding pads them."""
    g = torch.Generator().manual_seed(1)
    lengths = [random.Random(i).randint(1, 30) for i in range(N)]
    if preset.startswith("rnn"):
        eos = tokenizer.specials.eos
        sources = [
            [*torch.randint(4, tokenizer.vocab_size, (n,), generator=g).tolist(), eos] for n in lengths
        ]
        return lambda rows: pad([sources[i] for i in rows], tokenizer.specials.pad)
    if preset.startswith("las"):
        utterances = [torch.randn(10 * n, config.n_mels, generator=g) for n in lengths]
        return lambda rows: padded_frames([utterances[i] for i in rows])
    images = torch.rand(N, 1, config.image_size, config.image_size, generator=g)
    return lambda rows: images[rows]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize(("preset", "overrides"), MODELS)
def test_each_decoding_steps_logits_are_the_same_bits_whatever_the_batch(preset, overrides, precision):
    tokenizer = _tokenizer()
    model, config = _ready(preset, overrides, precision, tokenizer.vocab_size)
    batch = _inputs(preset, config, tokenizer)
    fed = torch.randint(4, tokenizer.vocab_size, (N, 3), generator=torch.Generator().manual_seed(2))

    def logits(rows: list[int]) -> torch.Tensor:
        """The logits of 4 steps of ``rows``' inputs, fed the same tokens: ``(len(rows), 4, V)``."""
        with torch.no_grad():
            decoding = model.decoding(batch(rows))
            tokens = torch.full((len(rows), 1), tokenizer.specials.bos)
            out = []
            for step in range(4):
                out.append(decoding.next_logits(tokens))  # (len(rows), V)
                if step < 3:
                    tokens = torch.cat([tokens, fed[rows, step : step + 1]], dim=1)
        return torch.stack(out, dim=1)

    alone = torch.cat([logits([i]) for i in range(N)])  # (N, 4, V)
    rng = random.Random(3)
    for size in (2, 3, 5, N):
        rows = rng.sample(range(N), size)
        got = logits(rows)
        differ = [rows[i] for i in range(size) if not torch.equal(got[i], alone[rows[i]])]
        assert not differ, f"a batch of {size}: the logits of inputs {differ} differ from alone"
    assert not torch.equal(alone[0], alone[1])  # inputs that differ get other logits


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize(("preset", "overrides"), MODELS)
def test_a_beam_search_finds_the_same_hypotheses_and_scores_alone_and_in_any_batch(
    preset, overrides, precision
):
    tokenizer = _tokenizer()
    model, config = _ready(preset, overrides, precision, tokenizer.vocab_size)
    batch = _inputs(preset, config, tokenizer)
    decode = load_run_config(None, [f"decode.precision={precision}"]).decode
    search = Search.of(decode, beam_size=3, n_best=3, max_output_len=8)

    def searched(rows: list[int]) -> list[list[Hypothesis]]:
        with torch.no_grad():
            first = torch.full((len(rows), 1), tokenizer.specials.bos)
            limits = torch.full((len(rows),), 8)
            return beam(model.decoding(batch(rows)), first, limits, tokenizer.specials, search)

    alone = [searched([i])[0] for i in range(N)]
    rows = random.Random(4).sample(range(N), N)
    for start, size in ((0, 4), (4, 6)):
        chosen = rows[start : start + size]
        for i, found in zip(chosen, searched(chosen), strict=True):
            assert found == alone[i], f"input {i} in a batch of {size}"
    assert len({h.score for hypotheses in alone for h in hypotheses}) > N  # not one answer for all
