"""Speculative decoding with compiled steps (``decode.steps=compiled``) is exact: the compiled check step
gives each of several new positions the bits the compiled step gives it a token at a time (the start
token's are the compiled first step's), for rows at different positions; and ``translate`` with
drafts (the source's, a compiled draft decoder's) gives plain greedy search's translations with the
same compiled steps, ``decode.steps=auto`` building the check step where the others are built."""

from __future__ import annotations

import copy
import dataclasses
import shutil

import pytest
import torch

from attnkit import build_transformer
from attnkit.config import load_run_config
from attnkit.cpu.compiled import steps as compiled_steps
from attnkit.cpu.compiled.build import CHECK_STEP
from attnkit.cpu.compiled.steps import step_package
from attnkit.data.batching import pad
from attnkit.data.synthetic import copy as copy_task
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.compiled import compiled_decoding
from attnkit.decode.continuous import RunningTranslations
from attnkit.decode.search import BeamSettings
from attnkit.decode.speculative import Speculation, economy
from attnkit.decode.streams import serial_steps
from attnkit.decode.translate import Reporting, translate
from attnkit.loading import ready_for_inference
from attnkit.models.config import TransformerConfig
from attnkit.models.draft import ShallowDraft
from tests.compiled_calls import NEEDS_COMPILER, CountingCalls
from tests.decode.drafting import counted_checks, settled

pytestmark = [
    NEEDS_COMPILER,
    pytest.mark.slow,  # each compiles steps with a C++ compiler (the slow set)
]

MODEL = {"d_model": 256, "d_ff": 1024, "h": 4, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.0}


@pytest.fixture(scope="module")
def ready(steps_cache):
    """A small random Transformer in bf16 (wide enough for oneDNN's kernels and the bf16 maps' blocks)
    with a shallow draft decoder, its word tokenizer and 16 sources of 1 to 12 digits."""
    tokenizer = Tokenizer.train("word", copy_task(400, seed=5, max_length=12).src)
    config = load_run_config(None, ["decode.precision=bf16", "decode.steps=compiled", "decode.batch_size=4"])
    return _model(tokenizer, config), tokenizer, config, copy_task(16, seed=99, max_length=12).src


def _model(tokenizer, config):
    """The model of :func:`ready` (drawn from the same seed: the same weights each time)."""
    torch.manual_seed(11)
    model = build_transformer(TransformerConfig.from_preset("tiny", **MODEL), tokenizer.vocab_size)
    model.draft = ShallowDraft(model)
    return ready_for_inference(model, config)


def test_the_check_step_gives_each_position_the_compiled_steps_bits(ready, monkeypatch):
    """The start token and five more checked at once against the same stepped one at a time; then,
    after the rows kept one, three and five of them (realigned), two more each against each row's
    own steps alone."""
    model, tokenizer, _, _ = ready
    specials = tokenizer.specials
    make = compiled_decoding(model, 1, None, specials.bos, checks=True)
    assert make is not None
    sources = [[*tokenizer.encode(t), specials.eos] for t in ["1 2 3 4", "5 6 7 8 9 1 2", "3 3 4"]]
    src = pad(sources, specials.pad, 1)
    tokens = torch.tensor([[specials.bos, *s] for s in [[4, 5, 6, 7, 8], [6, 7, 8, 9, 5], [7, 7, 9, 4, 6]]])
    counting = CountingCalls(monkeypatch)
    with torch.no_grad():
        checked = make(src)
        logits = checked.checked_logits(tokens, 6)  # (3, 6, V): the first step's, then one check step
        assert counting.calls == 2 and checked.history is not None
        stepped = make(src)
        for j in range(6):
            assert torch.equal(stepped.next_logits(tokens[:, : j + 1]), logits[:, j]), j
        assert counting.calls == 2 + 6
        checked.rewind(torch.tensor([1, 3, 5]), 6)
        kept = [tokens[0, :2], tokens[1, :4], tokens[2, :6]]
        more = torch.tensor([[9, 4], [4, 5], [5, 6]])
        rows = torch.stack([torch.cat([torch.full((5 - len(k) + 1,), specials.pad), k]) for k in kept])
        logits = checked.checked_logits(torch.cat([rows, more], 1), 3)  # (3, 3, V)
        assert counting.calls == 2 + 6 + 1
        for i, k in enumerate(kept):
            alone = make(src[i : i + 1, : len(sources[i])])
            for t in range(1, len(k)):  # its kept tokens but the last, a step at a time
                alone.next_logits(k[None, :t])
            for j in range(3):
                step = torch.cat([k, more[i, :j]])[None]
                assert torch.equal(alone.next_logits(step)[0], logits[i, j]), (i, j)


def test_a_row_that_keeps_its_draft_in_part_goes_on_in_the_history(ready, monkeypatch):
    """One row (speculative decoding's usual): the history forgets the positions not taken, and the
    next steps, compiled, give the bits of a search that never saw them."""
    model, tokenizer, _, _ = ready
    specials = tokenizer.specials
    make = compiled_decoding(model, 1, None, specials.bos, checks=True)
    src = torch.tensor([[*tokenizer.encode("5 6 7 8 9"), specials.eos]])
    tokens = torch.tensor([[specials.bos, 6, 7, 8, 9, 5, 6]])
    counting = CountingCalls(monkeypatch)
    with torch.no_grad():
        checked = make(src)
        checked.checked_logits(tokens[:, :5], 5)  # <s> and four drafted tokens
        checked.rewind(torch.tensor([2]), 5)  # kept <s> and the first
        assert checked.history is not None and len(checked.history) == 2
        wrong = torch.tensor([[specials.bos, 6, 4]])  # the model's own choice after them (say, 4)
        logits = checked.checked_logits(torch.cat([wrong, tokens[:, 3:5]], 1), 3)
        assert counting.calls == 3  # the first step, a check of four tokens, a check of three
        stepped = make(src)
        for j in range(2):
            stepped.next_logits(tokens[:, : j + 1])
        expected = [stepped.next_logits(torch.cat([wrong, tokens[:, 3 : 3 + j]], 1)) for j in range(3)]
    assert counting.calls == 3 + 5  # the first step and four steps of one token
    for j in range(3):
        assert torch.equal(expected[j][0], logits[0, j]), j


def test_translate_with_drafts_and_compiled_steps_gives_compiled_greedy_translations(ready, monkeypatch):
    """Each kind of draft over the compiled steps (the draft decoder's compiled too): the translations
    of plain greedy search with them, in batches of four (a batch's last row drafting)."""
    model, tokenizer, config, texts = ready
    warned: list[str] = []
    plain = translate(model, tokenizer, texts, config.decode, beam_size=1)
    counting = CountingCalls(monkeypatch)
    for speculative in ("source", "shallow"):
        config.decode.speculative = speculative
        speculation = Speculation()
        reporting = Reporting(warn=warned.append, speculation=speculation)
        assert translate(model, tokenizer, texts, config.decode, beam_size=1, reporting=reporting) == plain
        # (a random model's outputs share too little with their sources for the source's drafts)
        assert speculation.proposed or speculative == "source"
    assert counting.calls and not [w for w in warned if "could not compile" in w], warned
    assert any("draft decoder's" in w for w in warned), warned  # its steps were built too


def test_a_running_batch_checks_a_lone_greedy_sources_drafts_with_the_compiled_check_step(ready, monkeypatch):
    """A server's running batch with compiled steps and the draft decoder's guesses (its compiled
    steps built by the test above): greedy sources that join together, later, and alone each get the
    translation and score (to the bit) of a beam of one with the compiled steps and no drafts."""
    model, tokenizer, config, texts = ready
    decode = dataclasses.replace(config.decode, speculative="shallow")
    paying = economy(model, "a draft model, a running batch's compiled steps")
    paying.heard(True, 0.0, 1)  # drafts have cost nothing so far: every step drafts (but the 16th)
    paying.heard(False, 100.0, 1)
    checks = counted_checks(monkeypatch)
    greedy = BeamSettings(1, 1)
    arrivals = {0: [(0, texts[0], greedy), (1, texts[1], greedy)], 4: [(2, texts[2], greedy)],
                40: [(3, texts[5], greedy)]}  # fmt: skip
    running = RunningTranslations(model, tokenizer, decode)
    done, _ = settled(running, arrivals)
    assert running.decodings[1].compiled and running.decodings[1].checks
    plain = dataclasses.replace(decode, speculative="none")
    for key, text, _ in (arrival for joining in arrivals.values() for arrival in joining):
        assert done[key] == translate(model, tokenizer, [text], plain, n_best=1, beam_size=1)[0], key
    assert checks and sum(taken for _, taken in checks) > 0, checks


def test_another_checkpoints_model_drafts_with_compiled_steps_of_its_own(ready, monkeypatch):
    """A separate, narrower model as the draft (``decode.speculative=PATH``): its own compiled step and
    check step, over its own encoding of each source (the model's memory would not fit it), every
    batch drafting; the translations of plain greedy search with the model's compiled steps."""
    model, tokenizer, config, texts = ready
    plain = translate(model, tokenizer, texts, config.decode, beam_size=1)
    torch.manual_seed(3)
    narrow = {**MODEL, "d_model": 128, "d_ff": 256, "encoder_layers": 1, "decoder_layers": 1}
    narrow_model = build_transformer(TransformerConfig.from_preset("tiny", **narrow), tokenizer.vocab_size)
    # (its own copy of the settings: ready_for_inference writes the precision its maps take into them,
    # float32 for maps this narrow, which the other tests' models would then be made ready in)
    draft = ready_for_inference(narrow_model, copy.deepcopy(config))
    model.draft, shallow = draft, model.draft
    try:
        decode = dataclasses.replace(config.decode, speculative="elsewhere/small-run")
        paying = economy(model, "elsewhere/small-run, compiled steps")
        paying.heard(True, 0.0, 1)  # drafts have cost nothing so far: every batch drafts (but the 16th)
        paying.heard(False, 100.0, 1)
        speculation = Speculation()
        counting = CountingCalls(monkeypatch)
        found = translate(
            model, tokenizer, texts, decode, beam_size=1, reporting=Reporting(speculation=speculation)
        )
        assert found == plain and speculation.proposed > 0, speculation
        assert step_package(draft, 1, serial_steps(decode.streams)).is_file()  # the draft's own steps
        assert step_package(draft, CHECK_STEP, serial_steps(decode.streams)).is_file()
        assert counting.calls
    finally:
        model.draft = shallow


def test_auto_builds_the_check_step_where_the_plain_steps_are_built(ready):
    """``decode.steps=auto`` takes compiled steps where they are built: a greedy search with drafts
    then builds the check step it lacks (a check with the model's own steps would not give the bits
    of the compiled steps a search without drafts takes), and translates as plain greedy search."""
    model, tokenizer, config, texts = ready
    compiled = dataclasses.replace(config.decode, speculative="none")
    plain = translate(model, tokenizer, texts, compiled, beam_size=1)
    drafted = dataclasses.replace(compiled, speculative="source")  # every step built (by the tests above)
    assert translate(model, tokenizer, texts, drafted, beam_size=1) == plain
    twin = _model(tokenizer, config)  # the same weights: the same steps in the cache, none loaded yet
    check = step_package(twin, CHECK_STEP, serial_steps(config.decode.streams))
    assert check.is_file()
    check.unlink()
    shutil.rmtree(check.with_suffix(".unpacked"), ignore_errors=True)
    auto = dataclasses.replace(compiled, steps="auto", speculative="source")
    warned: list[str] = []
    got = translate(twin, tokenizer, texts, auto, beam_size=1, reporting=Reporting(warn=warned.append))
    assert got == plain
    assert check.is_file() and any("check step of drafts" in w for w in warned), warned


def test_a_running_batch_with_auto_steps_builds_no_check_step_and_takes_the_plain_ones(ready, monkeypatch):
    """``decode.steps=auto`` in a server's running batch where the plain compiled steps are built and
    the check step is not: it builds nothing (a build would hold every request of the batch for tens
    of seconds); its greedy sources take the plain compiled steps without drafts, the same
    translations and scores."""
    model, tokenizer, config, texts = ready
    twin = _model(tokenizer, config)  # the same weights: the same steps in the cache
    check = step_package(twin, CHECK_STEP, serial_steps(config.decode.streams))
    check.unlink(missing_ok=True)
    shutil.rmtree(check.with_suffix(".unpacked"), ignore_errors=True)
    other = step_package(twin, CHECK_STEP, not serial_steps(config.decode.streams))  # (either kind serves)
    assert not other.is_file()

    def refused(*args):
        raise AssertionError("a running batch built a step")

    monkeypatch.setattr(compiled_steps, "build", refused)
    checks = counted_checks(monkeypatch)
    decode = dataclasses.replace(config.decode, steps="auto", speculative="source")
    greedy = BeamSettings(1, 1)
    running = RunningTranslations(twin, tokenizer, decode)
    done, _ = settled(running, {0: [(0, texts[0], greedy)], 2: [(1, texts[3], greedy)]})
    assert running.decodings[1].compiled and not running.decodings[1].checks and not checks
    plain = dataclasses.replace(config.decode, speculative="none")
    for key, text in enumerate([texts[0], texts[3]]):
        assert done[key] == translate(model, tokenizer, [text], plain, n_best=1, beam_size=1)[0], key


def test_a_translators_server_builds_the_check_step_as_it_warms_up_and_its_running_batch_takes_it(
    ready, monkeypatch
):
    """A translator's server with compiled steps, drafts and a beam of one (``attnkit serve RUN
    decode.steps=compiled decode.speculative=shallow decode.beam_size=1``) builds greedy search's check
    step before it says it is ready (the test above removed it), not in a client's request: its running
    batch then builds nothing, checks the draft decoder's guesses with the compiled steps, and answers
    a beam of one's translation and score."""
    from pathlib import Path

    from attnkit.serve.translator import ServedTranslator

    model, tokenizer, config, texts = ready
    twin = _model(tokenizer, config)  # the same weights: the same steps in the cache
    check = step_package(twin, CHECK_STEP, serial_steps(config.decode.streams))
    check.unlink(missing_ok=True)
    shutil.rmtree(check.with_suffix(".unpacked"), ignore_errors=True)
    decode = dataclasses.replace(config.decode, beam_size=1, speculative="shallow")
    served = ServedTranslator(Path("run"), tokenizer, twin, dataclasses.replace(config, decode=decode),
                              torch.device("cpu"))  # fmt: skip
    served.warm_up()
    assert check.is_file() and served.steps() == "compiled"

    def refused(*args):
        raise AssertionError("a running batch built a step")

    monkeypatch.setattr(compiled_steps, "build", refused)
    paying = economy(twin, "a draft model, a running batch's compiled steps")
    paying.heard(True, 0.0, 1)  # drafts have cost nothing so far: every step drafts (but the 16th)
    paying.heard(False, 100.0, 1)
    checks = counted_checks(monkeypatch)
    greedy = BeamSettings(1, 1)
    done, _ = settled(served.running_batch(), {0: [(0, texts[0], greedy)], 3: [(1, texts[4], greedy)]})
    assert checks and sum(taken for _, taken in checks) > 0, checks
    plain = dataclasses.replace(config.decode, speculative="none")
    for key, text in enumerate([texts[0], texts[4]]):
        assert done[key] == translate(model, tokenizer, [text], plain, n_best=1, beam_size=1)[0], key
