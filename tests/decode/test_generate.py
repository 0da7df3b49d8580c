"""Generation from a decoder-only model: batched = one by one, cached = uncached, sampling as defined,
stop strings, streaming, and clear errors for prompts the model cannot take."""

import dataclasses
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnkit.config import DecodeConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.generate import Listening, TextStream, borders, generate, prefix_at_end
from attnkit.decode.sampling import restrict, sampler
from attnkit.decode.search import argmax, extend
from attnkit.errors import AttnkitError

TEXT = ["to be or not to be, that is the question", "all the world's a stage", "now is the winter"]
PROMPTS = ["to be", "a", "now is the win", "the question"]


def _decode(**settings) -> DecodeConfig:
    return DecodeConfig(**{"max_new_tokens": 12, "temperature": 0.0, "batch_size": 8, **settings})


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": 0.0},
        {"temperature": 1.0},
        {"temperature": 0.7, "top_k": 5},
        {"temperature": 1.3, "top_p": 0.8},
    ],
    ids=["greedy", "sampling", "top-k", "top-p"],
)
def test_batched_prompts_of_different_lengths_give_what_each_gives_alone(model_and_tokenizer, settings):
    model, tokenizer = model_and_tokenizer
    batched = generate(model, tokenizer, PROMPTS, _decode(**settings))
    for i, prompt in enumerate(PROMPTS):
        alone = _decode(**settings, seed=1337 + i)  # prompt i samples from seed + i
        assert generate(model, tokenizer, [prompt], alone) == [batched[i]]
    assert len(set(batched)) > 1 and all(batched)


def test_cached_generation_equals_uncached(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    ids = tokenizer.encode_batch(["to be", "now is t"])
    tokens = torch.tensor([[0, 0, 0, *ids[0]], ids[1]])
    valid = torch.tensor([[False] * 3 + [True] * 5, [True] * 8])
    limits = torch.tensor([10, 10])
    cached = extend(model.decoding(valid, use_cache=True), tokens, limits, tokenizer.specials, argmax)
    uncached = extend(model.decoding(valid, use_cache=False), tokens, limits, tokenizer.specials, argmax)
    assert cached == uncached and all(cached)


def test_sampling_is_reproducible_by_seed_and_changes_with_it(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    settings = {"temperature": 1.0, "max_new_tokens": 20}
    first = generate(model, tokenizer, PROMPTS, _decode(**settings, seed=1))
    assert generate(model, tokenizer, PROMPTS, _decode(**settings, seed=1)) == first
    assert generate(model, tokenizer, PROMPTS, _decode(**settings, seed=2)) != first


def test_restrict_keeps_the_top_k_and_the_smallest_top_p_set():
    torch.manual_seed(0)
    scores = torch.randn(4, 30)
    probs = scores.softmax(-1)
    for row in range(4):
        ranked = sorted(range(30), key=lambda j: -scores[row, j].item())
        kept_k = {j for j, v in enumerate(restrict(scores, top_k=7)[row].tolist()) if v > float("-inf")}
        assert kept_k == set(ranked[:7])
        smallest, mass = [], 0.0  # the definition: add tokens from the most probable until mass >= p
        for j in ranked:
            smallest.append(j)
            mass += probs[row, j].item()
            if mass >= 0.6:
                break
        kept_p = {j for j, v in enumerate(restrict(scores, top_p=0.6)[row].tolist()) if v > float("-inf")}
        assert kept_p == set(smallest)


def test_temperature_zero_is_greedy_and_top_k_one_is_greedy_too(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    greedy = generate(model, tokenizer, PROMPTS, _decode(temperature=0.0))
    assert generate(model, tokenizer, PROMPTS, _decode(temperature=1.0, top_k=1)) == greedy
    log_probs = torch.randn(5, 9).log_softmax(-1)
    generators = [torch.Generator().manual_seed(i) for i in range(5)]
    assert torch.equal(sampler(generators, temperature=0.0)(log_probs, torch.arange(5)), log_probs.argmax(-1))


def test_a_stop_string_ends_generation_before_it(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    full = generate(model, tokenizer, PROMPTS, _decode(max_new_tokens=20, temperature=1.0))
    stop = full[0][5:7]  # a string that appears in the first continuation
    stopped = generate(model, tokenizer, PROMPTS, _decode(max_new_tokens=20, temperature=1.0, stop=[stop]))
    for whole, cut in zip(full, stopped, strict=True):
        assert cut == (whole[: whole.index(stop)] if stop in whole else whole)
    assert stopped[0] == full[0][: full[0].index(stop)]


@pytest.mark.parametrize("with_stop", [False, True])
def test_streamed_pieces_add_up_to_the_output_even_with_stop_strings(model_and_tokenizer, with_stop):
    model, tokenizer = model_and_tokenizer
    settings = {"max_new_tokens": 15, "temperature": 1.0}
    full = generate(model, tokenizer, PROMPTS, _decode(**settings))
    stop = [full[0][4:8], "xyz"] if with_stop else []  # a stop string that does occur, after 4 characters
    pieces: dict[int, list[str]] = {}
    listening = Listening(lambda i, text: pieces.setdefault(i, []).append(text))
    outputs = generate(model, tokenizer, PROMPTS, _decode(**settings, stop=stop), listening=listening)
    assert not with_stop or outputs[0] == full[0][:4]
    assert ["".join(pieces.get(i, [])) for i in range(len(PROMPTS))] == outputs
    assert max(len(p) for p in pieces.values()) > 1  # the text came in pieces, as it was generated


def test_output_length_is_bounded_by_max_new_tokens_and_by_the_context(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    decode = _decode(max_new_tokens=7, temperature=1.0)
    for text in generate(model, tokenizer, PROMPTS, decode):
        assert len(tokenizer.encode(text)) <= 7
    long_prompt = "x" * 45  # the context is 48 tokens
    (text,) = generate(model, tokenizer, [long_prompt], dataclasses.replace(decode, max_new_tokens=100))
    assert len(tokenizer.encode(text)) <= 48 - 45


def test_prompts_the_model_cannot_take_are_one_clear_error(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    with pytest.raises(AttnkitError, match=r"prompt 2 has 60 tokens, but the model's context is 48 tokens"):
        generate(model, tokenizer, ["ok", "y" * 60], _decode())
    with pytest.raises(AttnkitError, match=r"prompt 1 is empty"):
        generate(model, tokenizer, [""], _decode())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batches_side_by_side_give_what_one_at_a_time_gives_and_no_gradients(
    model_and_tokenizer, temperature, two_threads
):
    """Two streams (decode/streams.py), each batch sampling with its prompts' own generators: the same
    texts as one batch at a time; no stream's thread records gradients (gradient mode is per thread)."""
    model, tokenizer = model_and_tokenizer
    prompts = [*PROMPTS, "that is", "all the", "or not"]
    graphs = []
    hook = model.register_forward_hook(lambda module, args, out: graphs.append(out.requires_grad))
    try:
        settings = {"temperature": temperature, "batch_size": 2}
        one = generate(model, tokenizer, prompts, _decode(**settings, streams=1))
        two = generate(model, tokenizer, prompts, _decode(**settings, streams=2))
    finally:
        hook.remove()
    assert two == one and len(set(one)) > 3
    assert graphs and not any(graphs)


@given(st.text(alphabet="ab", max_size=12), st.text(alphabet="ab", min_size=1, max_size=6))
def test_the_held_back_tail_is_the_longest_proper_prefix_of_the_stop_string_the_text_ends_with(text, stop):
    """Knuth-Morris-Pratt against the definition: the largest k < len(stop) with text ending in stop[:k]
    (k = 0 when none; the empty prefix always matches)."""
    expected = max(k for k in range(len(stop)) if text.endswith(stop[:k]))
    assert prefix_at_end(text, stop, borders(stop)) == expected


def test_a_long_stop_string_costs_linear_time_per_step():
    """A 100,000-character stop string: building every prefix each step (as it once did) took seconds
    per token; the KMP automaton reads the stop string's length once a step."""
    tokenizer = Tokenizer.train("char", ["ab"])
    stop = "a" * 99_999 + "b"
    stream = TextStream(tokenizer, [stop], [0], on_text=lambda i, text: None)
    ids = tokenizer.encode("a" * 50)
    began = time.perf_counter()
    for step in range(1, 21):
        stream.observe(torch.tensor([ids[:step]]))
    assert time.perf_counter() - began < 2.0
    assert stream.sent == [0]  # every "a" may still grow into the stop string: nothing sent yet


def test_a_row_that_is_no_longer_wanted_ends_at_the_next_step(model_and_tokenizer):
    """A server's client has gone: its prompt stops being extended; the others of the batch go on."""
    model, tokenizer = model_and_tokenizer
    decode = _decode(max_new_tokens=20, temperature=1.0)
    full = generate(model, tokenizer, PROMPTS, decode)
    steps = []

    def wanted(i):
        steps.append(i)
        return i != 1 or steps.count(1) < 3  # prompt 1 is dropped after its third step

    cut = generate(model, tokenizer, PROMPTS, decode, listening=Listening(wanted=wanted))
    assert [c for i, c in enumerate(cut) if i != 1] == [f for i, f in enumerate(full) if i != 1]
    assert len(tokenizer.encode(cut[1])) == 3 and full[1].startswith(cut[1]) and len(full[1]) > len(cut[1])
