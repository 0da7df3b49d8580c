"""Speculative decoding is exact: greedy search with drafts (the source's tokens, a draft decoder's
guesses, drafts that know the answer but for spoilt tokens) gives every sentence the tokens plain
greedy search gives it, in every precision, alone and in batches whose rows take
different numbers of drafted tokens; a checked position's logits are the bits of a step of one token."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnkit import build_transformer
from attnkit.config import load_run_config
from attnkit.data.batching import pad
from attnkit.data.synthetic import copy
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.continuous import RunningTranslations
from attnkit.decode.drafts import ShallowDrafts, SourceDrafts
from attnkit.decode.search import BeamSettings, Search, argmax, extend, rank_continuations, starts_of
from attnkit.decode.speculative import (
    EXPLORE_EVERY,
    ROWS_DRAFTED,
    Economy,
    OneBeam,
    Speculation,
    economy,
    greedy_judge,
    speculative_search,
)
from attnkit.decode.translate import Reporting, translate
from attnkit.errors import AttnkitError
from attnkit.loading import ready_for_inference
from attnkit.models.config import TransformerConfig
from attnkit.models.decoding import Seq2SeqDecoding
from attnkit.models.draft import ShallowDraft
from tests.decode.drafting import Foretold, counted_checks, settled

PRECISIONS = ["fp32", "bf16", "int8"]
MODEL = {"d_model": 256, "d_ff": 1024, "h": 4, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.0}
SMALL = {"d_model": 128, "d_ff": 256, "encoder_layers": 1, "decoder_layers": 1}  # a draft model's


@pytest.fixture(scope="module")
def copying():
    """A small random Transformer (wide enough that the linear maps take oneDNN's kernels and the
    bf16 maps their blocks), its word tokenizer, and 24 sources of 1 to 12 digits."""
    data = copy(400, seed=5, max_length=12)
    tokenizer = Tokenizer.train("word", data.src)
    torch.manual_seed(11)
    model = build_transformer(TransformerConfig.from_preset("tiny", **MODEL), tokenizer.vocab_size)
    return model.state_dict(), tokenizer, copy(24, seed=99, max_length=12).src


def _ready(copying, precision: str, draft: bool = False, seed: int = 12, **changes):
    """The model in ``precision`` (with ``draft``, with a shallow draft decoder: a copy of its first
    layer); ``changes`` to its config make another (random) model, drawn from ``seed``."""
    state, tokenizer, _ = copying
    torch.manual_seed(seed)
    config = TransformerConfig.from_preset("tiny", **{**MODEL, **changes})
    model = build_transformer(config, tokenizer.vocab_size)
    if not changes:
        model.load_state_dict(state)
    if draft:
        model.draft = ShallowDraft(model)
    config = load_run_config(None, [f"decode.precision={precision}", "decode.steps=eager"])
    return ready_for_inference(model, config), tokenizer, config


def _searches(model, tokenizer, texts: list[str], drafts=None, most_rows: int | None = None):
    """Plain greedy search of ``texts`` as one batch, and speculative search with ``drafts`` (default:
    the source's; "shallow": the model's draft decoder's), with its counts; every row drafts at every
    step unless ``most_rows`` says how few must be left."""
    specials = tokenizer.specials
    sources = [[*ids, specials.eos] for ids in tokenizer.encode_batch(texts)]
    src = pad(sources, specials.pad, 8)
    start, limits = starts_of(src, specials, Search(max_len_a=1.0, max_len_b=3))
    with torch.no_grad():
        plain = extend(model.decoding(src), start, limits, specials, argmax)
        counts = Speculation()
        decoding = model.decoding(src)
        if drafts == "shallow":
            draft = Seq2SeqDecoding(model.draft, decoding.src, use_cache=True, memory=decoding.memory)
            drafts = ShallowDrafts(draft, specials)
        elif drafts is None:
            drafts = SourceDrafts([ids[:-1] for ids in sources])
        most_rows = len(texts) if most_rows is None else most_rows
        drafted = speculative_search(decoding, start, limits, specials, drafts, counts, most_rows)
    return plain, drafted, counts


@pytest.mark.parametrize("precision", PRECISIONS)
def test_drafts_give_every_sentence_plain_greedy_searchs_tokens_alone_and_in_a_batch(copying, precision):
    model, tokenizer, _ = _ready(copying, precision)
    texts, eos = copying[2], tokenizer.specials.eos
    plain, drafted, _ = _searches(model, tokenizer, texts)  # drafts from the source: mostly refused
    assert drafted == plain
    for spoiled in (2, 5, 1000):  # drafts right half of the time, most of the time, all the time
        foretold = Foretold([[*ids, eos] for ids in plain], spoiled, seed=spoiled)
        again, drafted, counts = _searches(model, tokenizer, texts, foretold)
        assert again == plain and drafted == plain, spoiled
        assert counts.per_step > {2: 1.2, 5: 1.8, 1000: 3}[spoiled], (spoiled, counts)
        if spoiled == 1000:
            assert counts.acceptance > 0.99
    for text, expected in zip(texts[:6], plain[:6], strict=True):  # alone: the same
        foretold = Foretold([[*expected, eos]], 3, seed=0)
        assert _searches(model, tokenizer, [text], foretold)[:2] == ([expected], [expected])
        assert _searches(model, tokenizer, [text])[1] == [expected]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_draft_decoders_guesses_give_plain_greedy_searchs_tokens(copying, precision):
    """A shallow draft decoder's guesses, checked: plain greedy search's tokens whether the draft guesses
    poorly (its one layer beside a model of two) or perfectly (a one-layer model's own layer: every
    guess taken, rows keeping all their drafts and the draft reading its last guess at once)."""
    texts = copying[2]
    model, tokenizer, _ = _ready(copying, precision, draft=True)
    plain, drafted, counts = _searches(model, tokenizer, texts, "shallow")
    assert drafted == plain and counts.proposed
    for text, expected in zip(texts[:4], plain[:4], strict=True):  # alone: the same
        assert _searches(model, tokenizer, [text], "shallow")[1] == [expected]
    model, tokenizer, _ = _ready(copying, precision, draft=True, seed=11, decoder_layers=1)
    plain, drafted, counts = _searches(model, tokenizer, texts, "shallow")
    assert drafted == plain
    assert counts.acceptance == 1.0 and counts.per_step > 4, counts
    model, tokenizer, _ = _ready(copying, precision, draft=True, copy=True)  # the copy mechanism
    plain, drafted, counts = _searches(model, tokenizer, texts, "shallow")
    assert drafted == plain and counts.proposed


@pytest.mark.parametrize("precision", PRECISIONS)
def test_another_checkpoints_model_drafts_over_its_own_encoding(copying, precision):
    """A separate model of the same vocabulary as the draft (``decode.speculative=PATH``, which loading
    attaches as ``model.draft``): it encodes each source itself, and translate gives plain greedy
    search's translations whether it guesses poorly (a random model of one layer each side) or
    perfectly (a copy of the model: every guess taken). The poor one is narrower than the model: the
    model's memory would not fit it."""
    texts = copying[2]
    model, tokenizer, config = _ready(copying, precision)
    plain = translate(model, tokenizer, texts, config.decode, beam_size=1)
    for seed, changes, perfect in [(3, SMALL, False), (12, {}, True)]:
        model, tokenizer, config = _ready(copying, precision)
        model.draft = _ready(copying, precision, seed=seed, **changes)[0]
        config.decode.speculative, config.decode.batch_size = "elsewhere/draft-run", 1
        paying = economy(model, "elsewhere/draft-run, eager steps")
        paying.heard(True, 0.0, 1)  # drafts have cost nothing so far: every batch drafts (but the 16th)
        paying.heard(False, 100.0, 1)
        counts = Speculation()
        reporting = Reporting(speculation=counts)
        found = translate(model, tokenizer, texts, config.decode, beam_size=1, reporting=reporting)
        assert found == plain and counts.proposed > 0, counts
        assert (counts.acceptance == 1.0) == perfect, counts


def test_a_batch_drafts_once_one_row_is_left(copying):
    """By default (``ROWS_DRAFTED``) drafts are checked only where a single row is left: a batch's
    longest sentence drafts once the others have ended, its tokens as plain greedy search's."""
    model, tokenizer, _ = _ready(copying, "fp32", draft=True, seed=11, decoder_layers=1)
    by_length = sorted(copying[2], key=lambda text: len(text.split()))
    texts = [*by_length[:5], by_length[-1]]  # five short sentences and the longest
    plain, every, counts_every = _searches(model, tokenizer, texts, "shallow")
    _, last, counts_last = _searches(model, tokenizer, texts, "shallow", most_rows=ROWS_DRAFTED)
    assert every == last == plain
    assert 0 < counts_last.proposed < counts_every.proposed / 4, (counts_last, counts_every)
    longest = max(range(len(texts)), key=lambda i: len(plain[i]))
    alone = _searches(model, tokenizer, [texts[longest]], "shallow", most_rows=ROWS_DRAFTED)[2]
    assert counts_last.proposed <= alone.proposed


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_drafts_give_a_model_that_copies_plain_greedy_searchs_tokens(copying, precision):
    """The copy mechanism (a pointer-generator over the source) takes each checked position as a step
    would."""
    model, tokenizer, _ = _ready(copying, precision, copy=True)
    texts, eos = copying[2], tokenizer.specials.eos
    plain, drafted, _ = _searches(model, tokenizer, texts)
    assert drafted == plain
    foretold = Foretold([[*ids, eos] for ids in plain], 3, seed=1)
    assert _searches(model, tokenizer, texts, foretold)[1] == plain


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_checked_positions_logits_are_the_bits_of_a_step_of_one_token(copying, precision):
    """Five positions checked at once against the same five stepped one at a time, for rows at
    different positions (after a rewind that kept one, three and five of them)."""
    model, tokenizer, _ = _ready(copying, precision)
    specials = tokenizer.specials
    sources = [[*tokenizer.encode(t), specials.eos] for t in ["1 2 3 4", "5 6 7 8 9 1 2", "3 3 4"]]
    src = pad(sources, specials.pad, 8)
    tokens = torch.tensor(
        [[specials.bos, *s[:5]] for s in [[4, 5, 6, 7, 8], [6, 7, 8, 9, 5], [7, 7, 9, 4, 6]]]
    )
    with torch.no_grad():
        checked = model.decoding(src)
        logits = checked.checked_logits(tokens, 6)  # (3, 6, V)
        stepped = model.decoding(src)
        for j in range(6):
            assert torch.equal(stepped.next_logits(tokens[:, : j + 1]), logits[:, j])
        # rows keep 1, 3 and 5 of their new positions, then check two more each
        checked.rewind(torch.tensor([1, 3, 5]), 6)
        kept = [tokens[0, :2], tokens[1, :4], tokens[2, :6]]
        more = torch.tensor([[9, 4], [4, 5], [5, 6]])
        rows = torch.stack([torch.cat([torch.full((5 - len(k) + 1,), specials.pad), k]) for k in kept])
        logits = checked.checked_logits(torch.cat([rows, more], 1), 3)  # (3, 3, V)
    for i, k in enumerate(kept):
        with torch.no_grad():
            alone = model.decoding(src[i : i + 1])
            for t in range(1, len(k)):  # its kept tokens but the last, a step at a time
                alone.next_logits(k[None, :t])
            for j in range(3):
                step = torch.cat([k, more[i, :j]])[None]
                assert torch.equal(alone.next_logits(step)[0], logits[i, j]), (i, j)


def test_translate_with_drafts_gives_greedy_translations(copying):
    model, tokenizer, config = _ready(copying, "bf16", draft=True)
    texts = [*copying[2][:10], "", "  "]
    plain = translate(model, tokenizer, texts, config.decode, beam_size=1)
    for speculative in ("source", "shallow"):
        config.decode.speculative = speculative
        assert translate(model, tokenizer, texts, config.decode, beam_size=1) == plain
    model.draft = None
    with pytest.raises(AttnkitError, match="needs the model's draft decoder, and this model has none"):
        translate(model, tokenizer, texts, config.decode, beam_size=1)


def test_source_drafts_follow_the_first_match_of_the_longest_run_of_last_tokens():
    drafts = SourceDrafts([[5, 6, 7, 8, 5, 6, 9, 2]])
    assert drafts.follow(0, [], 3) == []  # nothing written: nothing to match
    assert drafts.follow(0, [1, 5, 6], 2) == [7, 8]  # "5 6" first occurs at 0
    assert drafts.follow(0, [8, 5, 6], 4) == [9, 2]  # "8 5 6" occurs at 3: what follows it
    assert drafts.follow(0, [3, 3], 4) == []  # no match
    assert drafts.follow(0, [1, 7], 4) == []  # one token matched: too weak a match
    assert drafts.follow(0, [9, 2], 4) == []  # a match with nothing after it
    assert drafts.follow(0, [5, 6], 0) == []


def test_a_batch_drafts_where_drafted_tokens_have_cost_less_and_now_and_then_the_other_way():
    """Economy: the first batch drafts, the second does not; then the cheaper way per token (by moving
    sums: long batches weigh more), the other one batch in EXPLORE_EVERY, and a change of costs heard
    in those turns the choice."""
    paying = Economy()
    assert paying.drafting() is True
    paying.heard(True, 3.0, 10)  # 0.3 s a token with drafts
    assert paying.drafting() is False
    paying.heard(False, 2.0, 10)  # 0.2 s without
    chosen = []
    for _ in range(2 * EXPLORE_EVERY):
        chosen.append(paying.drafting())
        paying.heard(chosen[-1], 3.0 if chosen[-1] else 2.0, 10)
    assert chosen.count(True) == 2 and chosen.count(False) == 2 * EXPLORE_EVERY - 2, chosen
    for _ in range(3 * EXPLORE_EVERY):  # drafts get cheap (0.05 s a token): heard when explored, taken
        drafting = paying.drafting()
        paying.heard(drafting, 0.5 if drafting else 2.0, 10)
    chosen = [paying.drafting() for _ in range(EXPLORE_EVERY)]
    assert chosen.count(True) == EXPLORE_EVERY - 1, chosen
    long_and_cheap = Economy()  # a long batch's cost per token outweighs a short one's
    long_and_cheap.drafting(), long_and_cheap.heard(True, 1.0, 2)  # 0.5 s a token, 2 tokens
    long_and_cheap.heard(True, 10.0, 100)  # 0.1 s a token, 100 tokens: (0.8 + 2.0) / (1.6 + 20) s
    long_and_cheap.heard(False, 0.2, 1)  # 0.2 s a token without
    assert long_and_cheap.drafting() is True


def test_translate_decides_by_the_economy_and_gives_the_same_translations_either_way(copying):
    """A model whose drafted batches have cost more searches plain (no token proposed), but every
    EXPLORE_EVERY-th batch; the translations are greedy search's either way."""
    model, tokenizer, config = _ready(copying, "fp32", draft=True)
    texts = copying[2][:8]
    config.decode.batch_size = 1
    plain = translate(model, tokenizer, texts, config.decode, beam_size=1)
    config.decode.speculative = "shallow"
    paying = economy(model, "shallow, eager steps")
    paying.heard(True, 100.0, 1)  # drafts have cost 100 s a token, plain steps nothing
    paying.heard(False, 0.0, 1)
    counts = Speculation()
    reporting = Reporting(speculation=counts)
    got = translate(model, tokenizer, texts, config.decode, beam_size=1, reporting=reporting)
    assert got == plain and counts.proposed == 0 and counts.steps == 0


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_smaller_captioners_guesses_give_greedy_captions(precision):
    """A Transformer captioner with a narrower one as its draft (``decode.speculative=PATH``): the
    captions of plain greedy search, the draft encoding each image itself; drafts copied from a source
    are refused in one line (an image has none)."""
    from attnkit.decode.captions import caption
    from attnkit.models.caption_transformer import CaptionTransformer, CaptionTransformerConfig

    tokenizer = Tokenizer.train("word", ["one two three four five six seven eight nine zero"])
    config = load_run_config(None, [f"decode.precision={precision}", "decode.batch_size=1"])
    models = []
    for seed, d_model in [(4, 256), (5, 128)]:
        torch.manual_seed(seed)
        sizes = {"d_model": d_model, "d_ff": 2 * d_model, "image_size": 24, "max_len": 12}
        shape = CaptionTransformerConfig.from_preset("caption-transformer-tiny", **sizes)
        models.append(ready_for_inference(CaptionTransformer(shape, tokenizer.vocab_size), config))
    model, draft = models
    images = torch.rand(6, 1, 24, 24, generator=torch.Generator().manual_seed(0))
    plain = caption(model, tokenizer, images, config.decode, beam_size=1)
    model.draft = draft
    decode = dataclasses.replace(config.decode, speculative="elsewhere/small-captioner")
    paying = economy(model, "elsewhere/small-captioner, eager steps")
    paying.heard(True, 0.0, 1)  # drafts have cost nothing so far: every batch drafts (but the 16th)
    paying.heard(False, 100.0, 1)
    counts = Speculation()
    assert caption(model, tokenizer, images, decode, beam_size=1, speculation=counts) == plain
    assert counts.proposed > 0 and any(plain), counts
    with pytest.raises(AttnkitError, match="a caption's input is an image"):
        caption(model, tokenizer, images, dataclasses.replace(decode, speculative="source"), beam_size=1)


def test_one_beams_judge_chooses_and_scores_as_beam_search_ranks_a_beam_of_one():
    """``OneBeam`` keeps the drafted tokens beam search of one beam would choose, by its own ranking
    (``rank_continuations``: the beam's score plus each token's log-probability, in float32, the first
    of equals), and carries the score: where the score is large, two log-probabilities that differ
    round to one candidate score, and beam search takes the first of them, not the more probable
    (which greedy search's rule would)."""
    torch.manual_seed(0)
    V, eos = 40, 2
    log_probs = torch.randn(1, 4, V).log_softmax(-1)  # (1, 4, V): a draft of three, then one more
    proposal = [int(t) for t in log_probs[0, :3].argmax(-1)]  # each position's most probable token
    log_probs[0, 1] = -20.0
    log_probs[0, 1, 9], log_probs[0, 1, 7] = -0.5, -0.5001  # the second position: 9, and 7 a hair less
    proposal[1] = 9
    score = torch.tensor([-1e4])  # where float32 steps by ~1e-3: 9 and 7 round to one candidate score
    judge = OneBeam(score, eos)
    (kept,) = judge(log_probs, [0], [proposal])
    expected, running = [], score
    for j in range(len(kept)):  # beam search's ranking, a step at a time
        best, _, token = rank_continuations(log_probs[:, j], running[:, None], 2)
        expected.append(int(token[0, 0]))
        running = best[:, 0]
    assert kept == expected == [proposal[0], 7]  # the first of two equal scores, then the draft refused
    assert torch.equal(judge.scores, running)
    assert greedy_judge(log_probs, [0], [proposal])[0][:2] == proposal[:2]  # greedy's rule: 9, not 7


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_scored_beam_of_one_with_drafts_gives_each_sentence_its_translation_and_score(copying, precision):
    """``translate --beam 1 --n-best 1`` (a beam of one, scored) with drafts (the source's; the draft
    decoder's, a copy of the model's first layer): each sentence gets the translation, score (to the
    bit) and token count of a beam of one without drafts, searched alone (drafting at every step) or in
    batches of four, where the row left last drafts (its score kept by its number in the batch)."""
    model, tokenizer, config = _ready(copying, precision, draft=True)
    twos = " ".join(["2"] * 12)  # (this random model answers it with 2s: its source drafts are right)
    texts = [*copying[2][:6], twos[:11], "", twos]
    plain = translate(model, tokenizer, texts, config.decode, n_best=1, beam_size=1)
    refused = 0
    for speculative in ("source", "shallow"):
        paying = economy(model, f"{speculative}, eager steps, scored")
        paying.heard(True, 0.0, 1)  # drafts have cost nothing so far: every batch drafts (but the 16th)
        paying.heard(False, 100.0, 1)
        for batch_size in (1, 4):
            decode = dataclasses.replace(config.decode, speculative=speculative, batch_size=batch_size)
            counts = Speculation()
            reporting = Reporting(speculation=counts)
            found = translate(model, tokenizer, texts, decode, n_best=1, beam_size=1, reporting=reporting)
            assert found == plain, (speculative, batch_size)  # texts, scores and counts, exactly
            assert counts.taken > 0, (speculative, batch_size, counts)
            refused += counts.proposed - counts.taken
    assert refused > 0  # (the draft decoder's guesses are wrong now and then)


@pytest.mark.parametrize("drafts", ["source", "shallow", "another model"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_running_batch_checks_a_lone_greedy_sources_drafts_for_its_translation_and_score(
    copying, precision, drafts, monkeypatch
):
    """A server's running batch (decode/continuous.py) with ``decode.speculative``: a greedy source
    searched alone checks drafts (its own tokens; the guesses of the model's draft decoder, here a
    one-layer model's own layer; of another model, here the model's twin), and every source gets the
    translation, score (to the bit) and token count ``translate`` gives it alone without drafts, whether
    it drafted alone, shared its steps with sources that joined (padded on the left) and left, or ran
    beside them with another beam."""
    if drafts == "shallow":
        model, tokenizer, config = _ready(copying, precision, draft=True, seed=11, decoder_layers=1)
    else:
        model, tokenizer, config = _ready(copying, precision)
    if drafts == "another model":
        model.draft = _ready(copying, precision)[0]
    speculative = {"source": "source", "shallow": "shallow", "another model": "runs/twin"}[drafts]
    decode = dataclasses.replace(config.decode, speculative=speculative, streams=1)
    kind = "source" if drafts == "source" else "a draft model"
    paying = economy(model, f"{kind}, a running batch's eager steps")
    paying.heard(True, 0.0, 1)  # drafts have cost nothing so far: every step drafts (but the 16th)
    paying.heard(False, 100.0, 1)
    checks = counted_checks(monkeypatch)  # (drafted, taken) of each check in a running batch
    greedy, wide = BeamSettings(1, 1), BeamSettings(3, 2)
    twos = " ".join(["2"] * 12)  # (this random model answers it with 2s: its source drafts are right)
    arrivals = {
        0: [(0, twos[:11], greedy)],  # alone for three steps, then beside the others
        3: [(1, "1 7 4 6 9 2 8 9 4", greedy), (2, "7 4 3 4 4 3 2", wide)],  # padded on the left
        60: [(3, twos, greedy)],  # alone from its first step
    }
    running = RunningTranslations(model, tokenizer, decode)
    done, ended = settled(running, arrivals)
    plain = dataclasses.replace(decode, speculative="none")
    for key, text, settings in (arrival for joining in arrivals.values() for arrival in joining):
        alone = translate(model, tokenizer, [text], plain, n_best=settings.n_best, beam_size=settings.beam)
        assert done[key] == alone[0], (key, done[key], alone[0])  # texts, scores and counts, exactly
    drafted, taken = map(sum, zip(*checks, strict=True))
    assert drafted > 0 and taken > 0, checks
    (_, _, tokens), *_ = done[3]  # every guess right (its 2s; the twin's; a one-layer model's own layer)
    assert ended[3] - 60 + 1 < tokens + 1, (ended[3], tokens)  # fewer steps than tokens with </s>
    assert not running.drafting and not running.running
