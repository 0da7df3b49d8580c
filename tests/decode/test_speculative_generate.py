"""Speculative decoding of a decoder-only model is exact: greedy generation with drafts (copied from the
prompt and the text so far, or drafts that know the answer but for spoilt tokens) gives every prompt
the text plain greedy generation gives it, in every precision, alone and in batches whose rows take
different numbers of drafted tokens, with stop strings and streaming; a checked position's logits are
the bits of a step of one token, after a rewind too."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

from attnkit.config import DecodeConfig, load_run_config
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.continuous import RunningGenerations
from attnkit.decode.drafts import ContextDrafts, ShallowDrafts
from attnkit.decode.generate import Listening, generate
from attnkit.decode.search import extend
from attnkit.decode.speculative import Speculation, economy, speculative_search
from attnkit.decode.starts import prompt_sampler, ready_prompts
from attnkit.errors import AttnkitError
from attnkit.loading import ready_for_inference
from attnkit.models import build_model, from_preset
from attnkit.models.draft import ShallowCausalDraft
from tests.decode.drafting import Foretold, counted_checks, settled, trained_on

PRECISIONS = ["fp32", "bf16", "int8"]
TEXT = ["to be or not to be, that is the question", "all the world's a stage", "now is the winter"]
PROMPTS = ["to be", "a", "now is the win", "the question", "all the world", "xy"]


@pytest.fixture(scope="module")
def trained():
    """A small GPT (wide enough that the linear maps take oneDNN's kernels and the bf16 maps their
    blocks), trained for a moment on TEXT so that its greedy continuations repeat what it read: drafts
    copied from the context are then often right. Its weights and its tokenizer."""
    tokenizer = Tokenizer.train("char", TEXT)
    torch.manual_seed(0)
    config = from_preset("tiny-decoder", d_model=256, d_ff=512, h=4, max_len=64)
    model = trained_on(build_model(config, tokenizer.vocab_size), tokenizer, " / ".join(TEXT * 3), 60, 1e-3)
    return config, model.state_dict(), tokenizer


def _ready(trained, precision: str, draft: bool = False, **changes):
    """The model in ``precision``, as ``attnkit generate`` runs it (with ``draft``, with a shallow draft
    decoder: a copy of its first layer); ``changes`` to its config make another (random) model."""
    config, state, tokenizer = trained
    torch.manual_seed(12)
    model = build_model(dataclasses.replace(config, **changes), tokenizer.vocab_size)
    if not changes:
        model.load_state_dict(state)
    if draft:
        model.draft = ShallowCausalDraft(model)
    run = load_run_config(None, [f"decode.precision={precision}"])
    return ready_for_inference(model, run), tokenizer


def _decode(**settings) -> DecodeConfig:
    return DecodeConfig(**{"max_new_tokens": 30, "temperature": 0.0, "batch_size": 8, **settings})


def _both(model, tokenizer, prompts: list[str], drafts=None, observe=None):
    """Plain greedy generation of ``prompts`` as one batch (``extend`` with generate's greedy sampler)
    and speculative generation with ``drafts`` (default: copied from the context; "shallow": the
    model's draft decoder's guesses) checked at every step, with its counts."""
    decode, pad = _decode(), tokenizer.specials.pad
    encoded = tokenizer.encode_batch(prompts)
    with torch.no_grad():
        ready = ready_prompts(model, encoded, pad, decode, "cpu")
        choose = prompt_sampler([torch.Generator() for _ in prompts], decode)  # greedy: takes none
        plain = extend(ready.decoding, ready.tokens, ready.limits, tokenizer.specials, choose, observe)
        ready = ready_prompts(model, encoded, pad, decode, "cpu")
        if drafts == "shallow":
            drafts = ShallowDrafts(model.draft.decoding(ready.decoding.prompt_valid), tokenizer.specials)
        counts = Speculation()
        drafted = speculative_search(
            ready.decoding, ready.tokens, ready.limits, tokenizer.specials, drafts or ContextDrafts(encoded),
            counts, most_rows=len(prompts), normalised=True, observe=observe,
        )  # fmt: skip
    return plain, drafted, counts


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_checked_positions_logits_are_the_bits_of_a_step_of_one_token(trained, precision):
    """Five positions checked at once after left-padded prompts against the same five stepped one at a
    time; then, after a rewind that kept one, three and five of them, two more checked against each
    row's tokens stepped alone."""
    model, tokenizer = _ready(trained, precision)
    encoded = tokenizer.encode_batch(["to be or", "a", "now is the w"])
    more = torch.tensor([tokenizer.encode(t) for t in ["not t", "ll th", "inter"]])  # (3, 5)
    with torch.no_grad():
        ready = ready_prompts(model, encoded, tokenizer.specials.pad, _decode(), "cpu")
        checked, prompts = ready.decoding, ready.tokens
        stepped = ready_prompts(model, encoded, tokenizer.specials.pad, _decode(), "cpu").decoding
        checked.next_logits(prompts)
        logits = checked.checked_logits(torch.cat([prompts, more], 1), 5)  # (3, 5, V)
        stepped.next_logits(prompts)
        for j in range(5):
            assert torch.equal(stepped.next_logits(torch.cat([prompts, more[:, : j + 1]], 1)), logits[:, j])
        checked.rewind(torch.tensor([1, 3, 5]), 5)
        kept = [torch.cat([torch.tensor(p), m[:k]]) for p, m, k in zip(encoded, more, [1, 3, 5], strict=True)]
        width = max(map(len, kept))
        rows = torch.stack(
            [torch.cat([torch.full((width - len(k),), tokenizer.specials.pad), k]) for k in kept]
        )
        two = torch.tensor(tokenizer.encode_batch(["ab", "de", "wh"]))
        logits = checked.checked_logits(torch.cat([rows, two], 1), 2)  # (3, 2, V)
        for i, k in enumerate(kept):
            alone = ready_prompts(model, [encoded[i]], tokenizer.specials.pad, _decode(), "cpu").decoding
            alone.next_logits(torch.tensor([encoded[i]]))
            for t in range(len(encoded[i]) + 1, len(k) + 1):  # its kept tokens, a step at a time
                alone.next_logits(k[None, :t])
            for j in range(2):
                step = torch.cat([k, two[i, : j + 1]])[None]
                assert torch.equal(alone.next_logits(step)[0], logits[i, j]), (i, j)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_drafts_give_every_prompt_plain_greedy_generations_tokens_alone_and_in_a_batch(trained, precision):
    model, tokenizer = _ready(trained, precision)
    plain, drafted, counts = _both(model, tokenizer, PROMPTS)  # copied from the context
    assert drafted == plain and counts.taken > 0, counts
    eos = tokenizer.specials.eos
    for spoiled in (2, 1000):  # drafts right half of the time, all the time
        foretold = Foretold([[*ids, eos] for ids in plain], spoiled, seed=spoiled)
        again, drafted, counts = _both(model, tokenizer, PROMPTS, foretold)
        assert again == plain and drafted == plain, spoiled
        assert counts.per_step > {2: 1.2, 1000: 3}[spoiled], (spoiled, counts)
    for prompt, expected in zip(PROMPTS[:3], plain[:3], strict=True):  # alone: the same
        assert _both(model, tokenizer, [prompt])[1] == [expected]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_draft_decoders_guesses_give_plain_greedy_generations_tokens(trained, precision):
    """A GPT's one-layer draft's guesses, checked: plain greedy generation's tokens whether the draft
    guesses poorly (the first of two layers) or perfectly (a one-layer model's own layer: every guess
    taken, rows keeping all their drafts and the draft reading its last guess at once), with a prompt
    of one token among them (checked with the first drafts, its cache empty)."""
    model, tokenizer = _ready(trained, precision, draft=True)
    plain, drafted, counts = _both(model, tokenizer, PROMPTS, "shallow")
    assert drafted == plain and counts.proposed
    for prompt, expected in zip(PROMPTS[:3], plain[:3], strict=True):  # alone: the same
        assert _both(model, tokenizer, [prompt], "shallow")[1] == [expected]
    model, tokenizer = _ready(trained, precision, draft=True, layers=1)
    plain, drafted, counts = _both(model, tokenizer, PROMPTS, "shallow")
    assert drafted == plain
    assert counts.acceptance == 1.0 and counts.per_step > 1.5, counts  # (doubtful guesses end drafts)


def test_generate_with_drafts_gives_greedy_texts_with_stop_strings_and_streaming(trained):
    """``generate`` with ``decode.speculative=source``: the texts of plain greedy generation, also where
    a stop string ends them and where they are streamed (the pieces add up to the same texts)."""
    model, tokenizer = _ready(trained, "bf16")
    paying = economy(model, "source, eager steps")
    paying.heard(True, 0.0, 1)  # drafts have cost nothing so far: every batch drafts (but the 16th)
    paying.heard(False, 100.0, 1)
    pieces: dict[int, str] = {}
    listening = Listening(on_text=lambda i, piece: pieces.update({i: pieces.get(i, "") + piece}))
    for settings in ({"batch_size": 1}, {"stop": ["e "], "batch_size": 1}, {"stop": ["the"]}):
        plain = generate(model, tokenizer, PROMPTS, _decode(**settings))
        counts = Speculation()
        drafted = _decode(**settings, speculative="source")
        assert generate(model, tokenizer, PROMPTS, drafted, speculation=counts) == plain, settings
        assert counts.proposed > 0 or settings.get("batch_size") != 1  # (a batch drafts its last row)
        pieces.clear()
        assert generate(model, tokenizer, PROMPTS[:1], drafted, listening=listening) == plain[:1]
        assert pieces[0] == plain[0]


def test_a_decoders_drafts_need_its_draft_where_they_are_its_drafts_guesses(trained):
    model, tokenizer = _ready(trained, "fp32")
    with pytest.raises(AttnkitError, match="needs the model's draft decoder, and this model has none"):
        generate(model, tokenizer, PROMPTS, _decode(speculative="shallow"))
    model, tokenizer = _ready(trained, "fp32", draft=True)
    plain = generate(model, tokenizer, PROMPTS, _decode(batch_size=1))
    counts = Speculation()
    assert (
        generate(model, tokenizer, PROMPTS, _decode(batch_size=1, speculative="shallow"), speculation=counts)
        == plain
    )
    assert counts.proposed > 0


def test_context_drafts_follow_the_latest_match_of_the_longest_run_of_last_tokens():
    drafts = ContextDrafts([[5, 6, 7, 8, 5, 6, 9, 2]])
    assert drafts.follow(0, [], 3) == []  # the prompt's own last tokens, "6 9 2" and "9 2": not before
    assert drafts.follow(0, [5, 6], 2) == [9, 2]  # "5 6" last occurs at 4, before the tail
    assert drafts.follow(0, [8, 5, 6], 4) == [9, 2, 8, 5]  # "8 5 6": at 3, then the written tokens
    assert drafts.follow(0, [3, 3], 4) == []  # no match
    assert drafts.follow(0, [5, 6], 0) == []
    assert ContextDrafts([[1, 2, 1, 2, 1, 2]], longest=2).follow(0, [], 3) == [1, 2]


class Offered:
    """Drafts that offer the same tokens at every step, for certain (as drafts copied from the context
    are): the model keeps each with its own probability of it."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, rows, written, lengths, tokens) -> list[list[int]]:
        return [self.tokens[:n] for n in lengths]

    def drawn_from(self, index):
        return None

    def checked(self, kept) -> None:
        pass

    def keep(self, index) -> None:
        pass


def _sampled_runs(model, tokenizer, prompt: str, n: int, decode: DecodeConfig, drafts=None) -> list[str]:
    """``n`` continuations of ``prompt``, each from its own seed, as generate samples them (with
    ``drafts``: those drafts in place of the ones ``decode.speculative`` names); where it drafts, it drafts
    some tokens."""
    import attnkit.decode.generate as generating

    real, counts = generating._drafts, Speculation()
    if drafts is not None:
        generating._drafts = lambda *args: drafts
    try:
        texts = generate(model, tokenizer, [prompt] * n, decode, speculation=counts)
    finally:
        generating._drafts = real
    if decode.speculative != "none":
        assert counts.proposed > 0, counts
    return texts


def test_speculative_sampling_draws_the_models_own_texts(trained, monkeypatch):
    """Generation that samples with drafts checked by the acceptance rule gives the model's own
    distribution over texts: the first three characters after a prompt, over 2,000 draws, against
    ``p(a) p(b | a) p(c | a b)`` from the model's own forward pass (temperature 1, top-k 3: 27 texts),
    by a chi-square test, with drafts offered for certain (some likely, some not), with the guesses a
    draft decoder samples, and without drafts; keeping every drafted token instead fails it."""
    model, tokenizer = _ready(trained, "fp32", draft=True)
    prompt, n = "to be or not", 2000
    settings = {"temperature": 1.0, "top_k": 3, "max_new_tokens": 4, "batch_size": 1000}
    expected = _texts_distribution(model, tokenizer, prompt, settings, 3)
    likely = Offered(tokenizer.encode(max(expected, key=expected.get)[1:]))  # after the first character
    offered, drafted = _decode(**settings, speculative="source"), _decode(**settings, speculative="shallow")
    runs = {
        "plain": _sampled_runs(model, tokenizer, prompt, n, _decode(**settings)),
        "likely offered": _sampled_runs(model, tokenizer, prompt, n, offered, likely),
        "unlikely offered": _sampled_runs(
            model, tokenizer, prompt, n, offered, Offered(tokenizer.encode("zz"))
        ),
        "draft decoder": _sampled_runs(model, tokenizer, prompt, n, drafted),
    }
    for name, texts in runs.items():
        assert _chi2_of(texts, expected, n) < CHI2_999_26, name

    def keep_all(target, draft, drafted, generator):
        return [*drafted, int(torch.multinomial(target[len(drafted)], 1, generator=generator))]

    monkeypatch.setattr("attnkit.decode.speculative_sampling.kept_by_sampling", keep_all)
    kept_all = _sampled_runs(model, tokenizer, prompt, n, offered, likely)
    assert _chi2_of(kept_all, expected, n) > 10 * CHI2_999_26


# the chi-square distribution's 0.999 quantile at 26 degrees of freedom (NIST's Engineering Statistics
# Handbook 1.3.6.7.4): a correct search exceeds it once in a thousand runs
CHI2_999_26 = 54.052


def _texts_distribution(model, tokenizer, prompt: str, settings: dict, length: int) -> dict[str, float]:
    """The probability of each text of ``length`` characters after ``prompt`` under ``settings``'
    sampling, from the model's forward pass over the whole text (no cache, no steps)."""
    from attnkit.decode.sampling import distribution

    texts = {"": 1.0}
    for _ in range(length):
        grown = {}
        for text, p in texts.items():
            ids = torch.tensor([tokenizer.encode(prompt + text)])
            with torch.no_grad():
                log_probs = model(ids)[0, -1].log_softmax(-1, dtype=torch.float64)[None]
            probs = distribution(log_probs, settings["temperature"], settings["top_k"])[0]
            for token in probs.nonzero()[:, 0].tolist():
                grown[text + tokenizer.decode([token])] = p * float(probs[token])
        texts = grown
    return texts


def _chi2_of(texts: list[str], expected: dict[str, float], n: int) -> float:
    """Pearson's statistic of the texts' first three characters against ``expected``; infinite where
    one has no probability at all."""
    counts: dict[str, int] = {}
    for text in texts:
        counts[text[:3]] = counts.get(text[:3], 0) + 1
    if not set(counts) <= set(expected):
        return float("inf")
    return sum((counts.get(t, 0) - n * p) ** 2 / (n * p) for t, p in expected.items())


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_prompts_sampled_text_with_drafts_is_its_own_whatever_its_batch(trained, precision):
    """Sampling with drafts (from the context, or a draft decoder's samples): each prompt's text from
    its seed is the same alone and in a batch of others, whose rows keep different numbers of drafted
    tokens at every step."""
    model, tokenizer = _ready(trained, precision, draft=True)
    for speculative in ("source", "shallow"):
        decode = _decode(temperature=0.9, top_k=8, seed=5, speculative=speculative)
        counts = Speculation()
        together = generate(model, tokenizer, PROMPTS, decode, speculation=counts)
        alone = [generate(model, tokenizer, [p], decode, seeds=[5 + i])[0] for i, p in enumerate(PROMPTS)]
        assert together == alone and counts.taken > 0, (speculative, counts)


@dataclass
class _Prompt:
    text: str
    seed: int
    sink: object = None


@pytest.mark.parametrize("drafts", ["source", "shallow", "another model"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_running_batch_checks_a_lone_greedy_prompts_drafts_for_its_plain_text(trained, precision, drafts):
    """A server's running batch (decode/continuous.py) with ``decode.speculative``: a greedy prompt
    continued alone checks drafts (copied from its context; guessed by the model's draft decoder; by
    another model, here the model's twin) and takes several tokens a step, and every prompt gets the
    text plain greedy generation gives it alone, whether it ran alone or beside others who joined and
    left (the first prompt drafts alone, shares its steps, then drafts alone again after the others'
    padding has gone: its draft's cache is made again), with stop strings and streaming (the pieces add
    up to the text); a sampled prompt beside them takes no drafts and gets plain sampling's text for
    its seed."""
    if drafts == "source":
        model, tokenizer = _ready(trained, precision)
    elif drafts == "shallow":  # a one-layer model drafting with a copy of its layer: every guess right
        model, tokenizer = _ready(trained, precision, draft=True, layers=1)
    else:
        model, tokenizer = _ready(trained, precision)
        model.draft = _ready(trained, precision)[0]  # (any path: the running batch reads model.draft)
    speculative = "source" if drafts == "source" else "shallow" if drafts == "shallow" else "runs/twin"
    kind = "source" if drafts == "source" else "a draft model"
    paying = economy(model, f"{kind}, a running batch's steps")
    paying.heard(True, 0.0, 1)  # drafts have cost nothing so far: every step drafts (but the 16th)
    paying.heard(False, 100.0, 1)
    settings = {
        "greedy": _decode(speculative=speculative),
        "stopped": _decode(speculative=speculative, stop=["e "]),
        "sampled": _decode(speculative=speculative, temperature=0.8),
    }
    plain = {name: dataclasses.replace(decode, speculative="none") for name, decode in settings.items()}
    # the first prompt runs alone for 3 steps, then others join at steps 3 and 5, and all leave at their
    # own steps; the last joins an empty batch once the others are done
    pieces: list[str] = []
    arrivals = {
        0: [(0, _Prompt(PROMPTS[0], 1), "greedy")],
        3: [(1, _Prompt(PROMPTS[4], 2), "greedy"), (2, _Prompt(PROMPTS[2], 3), "sampled")],
        5: [(3, _Prompt(PROMPTS[3], 4, pieces.append), "stopped")],
        60: [(4, _Prompt(PROMPTS[1], 5), "greedy")],
    }
    running = RunningGenerations(model, tokenizer, settings.__getitem__)
    done, steps = settled(running, arrivals)
    for key, prompt, name in (arrival for joining in arrivals.values() for arrival in joining):
        (alone,) = generate(model, tokenizer, [prompt.text], plain[name], seeds=[prompt.seed])
        assert done[key] == alone, (key, name)
    assert "".join(pieces) == done[3]
    iterations = steps[4] - 60 + 1  # alone from its first step to its last
    assert iterations < len(tokenizer.encode(done[4])), (iterations, done[4])  # fewer than its tokens


def test_a_lone_prompts_draft_reads_its_tokens_again_where_their_padding_changed(trained, monkeypatch):
    """A prompt that joins beside a longer one is padded on the left; alone after the other's client has
    gone it keeps that padding (nothing merged), and its draft caches its tokens so laid out. A third
    prompt joins and leaves: the running batch drops the padding no row needs, and the first prompt,
    alone again, drafts over tokens laid out otherwise. Its draft (a one-layer model's own layer: every
    guess right where the draft's cache holds the tokens the model's does) reads them all again: every
    guess is taken, and the text is plain greedy generation's."""
    model, tokenizer = _ready(trained, "fp32", draft=True, layers=1)
    paying = economy(model, "a draft model, a running batch's steps")
    paying.heard(True, 0.0, 1)  # drafts have cost nothing so far: every step drafts (but the 16th)
    paying.heard(False, 100.0, 1)
    decode = _decode(speculative="shallow", max_new_tokens=40)
    checks = counted_checks(monkeypatch)  # (drafted, taken) of each check in a running batch
    running = RunningGenerations(model, tokenizer, lambda settings: decode)
    first = _Prompt(PROMPTS[1], 1)
    arrivals = {0: [(0, first, "s"), (1, _Prompt(PROMPTS[2], 2), "s")], 9: [(2, _Prompt(PROMPTS[4], 3), "s")]}
    departures = {3: {1}, 12: {2}}
    layouts, done, i = [], {}, 0
    while 0 not in done:
        for key, text in running.iterate(arrivals.get(i, []), departures.get(i, set())):
            done[key] = text
        if len(running.continuing) == 1:
            (alone,) = running.continuing.values()
            extension = next(iter(running.running.values()))
            layouts.append(extension.tokens.size(1) - len(alone.generated))
        i += 1
        assert i < 200
    plain = dataclasses.replace(decode, speculative="none")
    assert done[0] == generate(model, tokenizer, [first.text], plain)[0]
    assert len(set(layouts)) == 2, layouts  # alone with the other's padding, then without it
    drafted, taken = map(sum, zip(*checks, strict=True))
    assert drafted > 10 and taken == drafted, checks
