"""decode.steps=compiled (cpu/compiled/, decode/compiled.py): the decoding step compiled ahead of time
translates exactly as the eager step, is kept and loaded again, follows changed weights, and steps
aside where it cannot work."""

import pytest
import torch

from attnkit import build_transformer
from attnkit.config import DecodeConfig
from attnkit.cpu.compiled import steps
from attnkit.cpu.compiled.build import FIRST_STEP
from attnkit.data.synthetic import copy
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.translate import Reporting, translate
from attnkit.models.config import TransformerConfig
from tests.compiled_calls import NEEDS_COMPILER, CountingCalls

pytestmark = [
    NEEDS_COMPILER,
    pytest.mark.slow,  # each compiles a step with a C++ compiler (the slow set)
]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    tokenizer = Tokenizer.train("word", copy(300, seed=0, max_length=6).src)
    torch.manual_seed(5)
    model = build_transformer(TransformerConfig.from_preset("tiny", output_bias=True), tokenizer.vocab_size)
    return model.eval(), tokenizer


@pytest.mark.parametrize("beam", [3, 1], ids=["beam 3", "greedy"])
def test_the_compiled_step_translates_exactly_as_the_eager_one(
    steps_cache, model_and_tokenizer, monkeypatch, beam
):
    model, tokenizer = model_and_tokenizer
    texts = [*copy(40, seed=2, max_length=6).src, "", "1 2 3 4 5 6 7 8 9 1 2 3 4 5 6"]  # empty, long
    eager = DecodeConfig(
        batch_size=7, streams=1, steps="eager"
    )  # batches of different sizes; sentences leave them
    notes = []
    counting = CountingCalls(monkeypatch)
    for streams in (0, 2):  # a stream per thread (the default), or two: the steps of serial loops
        fast = DecodeConfig(batch_size=7, streams=streams, steps="compiled")
        expected = translate(model, tokenizer, texts, eager, beam_size=beam)
        assert (
            translate(model, tokenizer, texts, fast, beam_size=beam, reporting=Reporting(warn=notes.append))
            == expected
        )
    assert (
        counting.calls > 20 and len(notes) == 1 and f"compiling the decoding step of beam {beam}" in notes[0]
    )  # (and the first step, where an earlier test has not built it: one line)
    calls = counting.calls
    translate(model, tokenizer, texts, eager, beam_size=beam)
    assert counting.calls == calls  # with the model's own steps, the eager step again
    if beam > 1:
        best = translate(model, tokenizer, texts, eager, n_best=2, beam_size=beam)
        found = translate(
            model, tokenizer, texts, DecodeConfig(batch_size=7, steps="compiled"), n_best=2, beam_size=beam
        )
        assert [[text for text, *_ in b] for b in found] == [[text for text, *_ in b] for b in best]
        scores = [score for b in found for _, score, _ in b], [score for b in best for _, score, _ in b]
        torch.testing.assert_close(*map(torch.tensor, scores), rtol=1e-5, atol=1e-5)


def test_a_compiled_step_is_kept_and_loaded_again_until_the_weights_change(
    steps_cache, model_and_tokenizer, monkeypatch
):
    model, tokenizer = model_and_tokenizer
    twin = build_transformer(model.config, tokenizer.vocab_size).eval()
    twin.load_state_dict(model.state_dict())
    texts = copy(10, seed=3, max_length=6).src
    expected = translate(model, tokenizer, texts, DecodeConfig(streams=1, steps="eager"), beam_size=3)
    built = []
    build = steps.build
    monkeypatch.setattr(steps, "build", lambda *args: built.append(args) or build(*args))
    notes = []
    assert (
        translate(
            twin,
            tokenizer,
            texts,
            DecodeConfig(steps="compiled"),
            beam_size=3,
            reporting=Reporting(warn=notes.append),
        )
        == expected
    )
    assert built == [] and notes == []  # the same weights: the step compiled for `model` is loaded
    with torch.no_grad():
        twin.generator.proj.bias.add_(torch.randn_like(twin.generator.proj.bias))
    changed = translate(twin, tokenizer, texts, DecodeConfig(streams=1, steps="eager"), beam_size=3)
    assert translate(twin, tokenizer, texts, DecodeConfig(steps="compiled"), beam_size=3) == changed
    assert sorted(beams for _, beams, *_ in built) == [FIRST_STEP, 3]  # new weights: new steps, both


def test_a_search_that_does_not_build_takes_the_steps_built_with_the_other_loops(
    steps_cache, model_and_tokenizer, monkeypatch
):
    """``decode.steps=auto`` on a small input builds nothing and takes the steps that are there, whatever
    their loops: one stream (whose own steps' loops share the threads) takes those built for batches
    side by side (the default's), with the same bits, rather than the model's own steps."""
    model, tokenizer = model_and_tokenizer
    texts = copy(10, seed=11, max_length=6).src
    built = []
    build = steps.build
    monkeypatch.setattr(steps, "build", lambda *args: built.append(args) or build(*args))
    counting = CountingCalls(monkeypatch)
    side_by_side = translate(model, tokenizer, texts, DecodeConfig(steps="compiled"), beam_size=3)
    calls = counting.calls
    one_stream = translate(model, tokenizer, texts, DecodeConfig(streams=1), beam_size=3)  # (auto)
    assert one_stream == side_by_side and counting.calls > calls
    assert built == []  # (an earlier test built the default's)


def test_a_search_walks_the_weights_once_to_find_its_compiled_steps(
    steps_cache, model_and_tokenizer, monkeypatch
):
    """Finding a search's steps asks whether they are built and for the first step and the beam's: the
    weights' fingerprint (a walk of every module, 0.2 ms) is taken once for all of them, not once each
    (a one-sentence ``attnkit translate`` with the default ``decode.steps=auto`` took it three times)."""
    from attnkit.decode import compiled

    model, tokenizer = model_and_tokenizer
    taken = []
    fingerprint = steps.weights_fingerprint
    counted = lambda model: taken.append(model) or fingerprint(model)  # noqa: E731
    monkeypatch.setattr(steps, "weights_fingerprint", counted)
    monkeypatch.setattr(compiled, "weights_fingerprint", counted)
    texts = copy(3, seed=12, max_length=6).src
    counting = CountingCalls(monkeypatch)
    for setting in ("compiled", "auto"):
        translate(model, tokenizer, texts[:1], DecodeConfig(steps=setting), beam_size=3)  # (built once)
        taken.clear()
        for text in texts:
            translate(model, tokenizer, [text], DecodeConfig(steps=setting), beam_size=3)
        assert len(taken) == len(texts), setting
    assert counting.calls > 2 * len(texts)  # the compiled steps took the searches


def _kernels(model, beams: int, serial: bool) -> str:
    """The C++ source of the loops AOTInductor wrote for a step in the cache."""
    unpacked = steps.step_package(model, beams, serial).with_suffix(".unpacked")
    return "".join(path.read_text(encoding="utf-8") for path in unpacked.rglob("*.kernel.cpp"))


def test_a_step_is_built_with_the_loops_its_streams_run(steps_cache, model_and_tokenizer):
    """The steps' loops follow ``decode.streams``, not the threads of the process that happens to build
    them: serial for a stream per thread (the default), OpenMP loops that take the caller's threads for
    one stream on every thread; and the two give the same translations, bit for bit."""
    model, tokenizer = model_and_tokenizer
    texts = copy(20, seed=9, max_length=6).src
    beams = {"n_best": 3, "beam_size": 3}
    expected = translate(model, tokenizer, texts, DecodeConfig(streams=1, steps="eager"), **beams)
    threads = torch.get_num_threads()
    try:  # one batch, so one stream, on 2 threads, for either (the eager parts' sums follow the threads)
        torch.set_num_threads(2)  # (a process of 2 threads once built OpenMP loops, whatever the streams)
        serial = translate(model, tokenizer, texts, DecodeConfig(batch_size=64, steps="compiled"), **beams)
        torch.set_num_threads(1)  # (and one of 1 thread plain ones)
        one_stream = DecodeConfig(batch_size=64, streams=1, steps="compiled")
        translate(model, tokenizer, texts[:1], one_stream, **beams)
        torch.set_num_threads(2)
        parallel = translate(model, tokenizer, texts, one_stream, **beams)
    finally:
        torch.set_num_threads(threads)
    assert [[text for text, *_ in b] for b in serial] == [[text for text, *_ in b] for b in expected]
    assert parallel == serial  # texts and scores, to the last bit
    for width in (FIRST_STEP, 3):
        assert "omp parallel" not in _kernels(model, width, serial=True)
        loops = _kernels(model, width, serial=False)
        assert "#pragma omp parallel" in loops and "num_threads(" not in loops  # the caller's threads


def test_where_the_step_cannot_be_compiled_translation_goes_on_and_says_so(
    steps_cache, model_and_tokenizer, monkeypatch
):
    model, tokenizer = model_and_tokenizer
    texts = copy(10, seed=4, max_length=6).src
    expected = translate(model, tokenizer, texts, DecodeConfig(streams=1, steps="eager"), beam_size=2)

    def no_compiler(*args):
        raise RuntimeError("C++ compile error\nmore detail")

    monkeypatch.setattr(steps, "build", no_compiler)
    notes = []
    assert (
        translate(
            model,
            tokenizer,
            texts,
            DecodeConfig(steps="compiled"),
            beam_size=2,
            reporting=Reporting(warn=notes.append),
        )
        == expected
    )
    assert notes[-1] == (
        "decode.steps: could not compile the decoding step (C++ compile error); it decodes with the "
        "model's own steps"
    )
    copying = build_transformer(TransformerConfig.from_preset("tiny", copy=True), tokenizer.vocab_size).eval()
    notes = []
    translate(
        copying,
        tokenizer,
        texts,
        DecodeConfig(steps="compiled"),
        beam_size=2,
        reporting=Reporting(warn=notes.append),
    )
    assert "this model's steps are not compiled" in notes[0]


def test_a_running_batch_takes_the_compiled_steps_and_gives_each_source_its_translation(
    steps_cache, model_and_tokenizer, monkeypatch
):
    """Continuous batching (decode/continuous.py) with compiled steps: sources that join the compiled
    step's history at later steps get the eager ``translate``'s translation of them, with its scores."""
    from attnkit.decode.continuous import RunningTranslations
    from attnkit.decode.search import BeamSettings

    model, tokenizer = model_and_tokenizer
    texts = copy(24, seed=8, max_length=6).src
    eager = DecodeConfig(batch_size=64, streams=1, steps="eager")
    counting = CountingCalls(monkeypatch)
    running = RunningTranslations(model, tokenizer, DecodeConfig(batch_size=64, steps="compiled"))
    waiting = [(n, text, BeamSettings(3, 2) if n % 2 else BeamSettings(1, 1)) for n, text in enumerate(texts)]
    done = {}
    while waiting or running.sources:
        joining, waiting = waiting[:2], waiting[2:]  # two join at every step
        done.update(running.iterate(joining))
    assert counting.calls > 20
    for n, text in enumerate(texts):
        beam, n_best = (3, 2) if n % 2 else (1, 1)
        (expected,) = translate(model, tokenizer, [text], eager, beam_size=beam, n_best=n_best)
        assert [(t, k) for t, _, k in done[n]] == [(t, k) for t, _, k in expected]
        assert [s for _, s, _ in done[n]] == pytest.approx([s for _, s, _ in expected], abs=1e-5)


def test_auto_takes_compiled_steps_where_built_and_builds_them_for_a_large_input(
    steps_cache, model_and_tokenizer, monkeypatch
):
    """``decode.steps=auto`` (the default): a small input takes the model's own steps while no compiled
    ones are built, and builds none; an input of ``REPAYING_SENTENCES`` builds them, saying so in one
    line; after that a small input takes them too, from the cache. The translations are the eager
    step's."""
    from attnkit.decode import starts

    model, tokenizer = model_and_tokenizer
    texts = copy(12, seed=9, max_length=6).src
    expected = translate(model, tokenizer, texts, DecodeConfig(streams=1, steps="eager"), beam_size=4)
    counting, notes, auto = CountingCalls(monkeypatch), [], DecodeConfig(streams=1)
    reporting = Reporting(warn=notes.append)
    assert translate(model, tokenizer, texts, auto, beam_size=4, reporting=reporting) == expected
    assert counting.calls == 0 and notes == []  # not built for beam 4, and not worth building for 12
    monkeypatch.setattr(starts, "REPAYING_SENTENCES", len(texts))
    assert translate(model, tokenizer, texts, auto, beam_size=4, reporting=reporting) == expected
    assert counting.calls > 0 and len(notes) == 1 and "compiling the decoding step of beam 4" in notes[0]
    monkeypatch.setattr(starts, "REPAYING_SENTENCES", 10**9)
    calls = counting.calls
    assert translate(model, tokenizer, texts[:3], auto, beam_size=4, reporting=reporting) == expected[:3]
    assert counting.calls > calls and len(notes) == 1  # built: taken, with nothing more to say


def test_a_running_batch_takes_compiled_steps_once_they_are_built_beside_it(
    steps_cache, model_and_tokenizer, monkeypatch
):
    """A server's running batch with ``decode.steps=auto`` (serve/building.py builds the steps in another
    process meanwhile): the sources that join once the compiled steps are in the cache take them, in a
    running batch of their own, while those that joined before finish with the model's own; each gets
    ``translate``'s translation of it alone, with the steps that were there when it joined."""
    from attnkit.decode import continuous
    from attnkit.decode.continuous import RunningTranslations
    from attnkit.decode.search import BeamSettings

    monkeypatch.setattr(continuous, "LOOK_AGAIN_S", 0.0)
    model, tokenizer = model_and_tokenizer
    texts = copy(16, seed=10, max_length=6).src
    settings = BeamSettings(5, 1)
    counting = CountingCalls(monkeypatch)
    running = RunningTranslations(model, tokenizer, DecodeConfig(streams=1))
    done, batches = {}, set()
    for n, text in enumerate(texts):
        if n == 8:  # built now, as the server's build process would
            translate(model, tokenizer, ["1 2"], DecodeConfig(streams=1, steps="compiled"), beam_size=5)
            assert counting.calls > 0
            counting.calls = 0
        done.update(running.iterate([(n, text, settings)]))
        batches |= set(running.running)
    while running.sources:
        done.update(running.iterate([]))
    assert batches == {(settings, False), (settings, True)} and counting.calls > 0
    eager = translate(
        model, tokenizer, texts[:8], DecodeConfig(streams=1, steps="eager"), beam_size=5, n_best=1
    )
    compiled = translate(model, tokenizer, texts[8:], DecodeConfig(streams=1), beam_size=5, n_best=1)
    found = [best for n in range(len(texts)) for best in done[n]]
    expected = [best for bests in eager + compiled for best in bests]
    assert [text for text, *_ in found] == [text for text, *_ in expected]
    # (this model's linear maps are plain ones, whose sums depend on the rows: ready_for_inference's don't)
    assert [score for _, score, _ in found] == pytest.approx([score for _, score, _ in expected], abs=1e-5)


def test_beam_searchs_compiled_step_ranks_by_blocks_as_the_search_does(steps_cache, monkeypatch):
    """Beam search's compiled step ranks each source's continuations itself (trace.RankedStep: the
    log-softmax applied only to the entries the blockwise ranking reads), where the search would rank
    the step's logits: the same hypotheses as the model's own steps, a vocabulary of 1,700 tokens (26
    blocks of 64 and a partial one), the search ranking only the first step's logits; and each source
    alone gets what it gets in the batch, bit for bit."""
    from attnkit.cpu import speed_up
    from attnkit.cpu.compiled.build import compilable
    from attnkit.data.tokenizer import SpecialIds
    from attnkit.decode import Search, beam_search
    from attnkit.decode import search as searching
    from attnkit.decode.compiled import compiled_decoding

    ids = SpecialIds(pad=0, unk=1, bos=2, eos=3)
    torch.manual_seed(7)
    # as the batch-invariance tests' models: their linear maps take both of float32's kernels
    config = TransformerConfig.from_preset("tiny", d_model=256, d_ff=1024, h=4, dropout=0.0,
                                           encoder_layers=1, decoder_layers=1)  # fmt: skip
    model = build_transformer(config, 1_700).eval()
    speed_up(model)  # (as translate prepares a model)
    src = torch.randint(4, 1_700, (6, 9))
    src[1, 5:], src[4, 3:] = ids.pad, ids.pad
    search = Search(beam_size=3, n_best=3, max_len_a=1.0, max_len_b=5)
    expected = beam_search(model, src, ids, search)
    decoding = compiled_decoding(model, 3, start_token=ids.bos)
    assert compilable(model) and decoding is not None
    ranked = []
    rank = searching.rank_continuations
    monkeypatch.setattr(searching, "rank_continuations", lambda *args: ranked.append(1) or rank(*args))
    counting = CountingCalls(monkeypatch)
    found = beam_search(model, src, ids, search, decoding=decoding)
    assert [[h.tokens for h in hs] for hs in found] == [[h.tokens for h in hs] for hs in expected]
    for got, want in zip(found, expected, strict=True):
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-4)
    assert len(ranked) == 1 and counting.calls >= 5  # the search ranked the first step; the step the rest
    for i in range(len(src)):
        alone = beam_search(model, src[i : i + 1, : int((src[i] != ids.pad).sum())], ids, search,
                            decoding=decoding)  # fmt: skip
        assert [(h.tokens, h.score) for h in alone[0]] == [(h.tokens, h.score) for h in found[i]]


def test_a_cached_step_of_another_layout_is_refused_with_a_line_not_called(steps_cache, model_and_tokenizer):
    """A package under a step's key that takes other inputs (built by a development attnkit that kept
    the version and the layout's number) would abort the process when called: it is refused as it
    loads, with one line that says how to clear it, and the search decodes with the model's own steps."""
    import shutil as files

    model, tokenizer = model_and_tokenizer
    greedy = steps.compiled_step(model, 1, True)  # (built by an earlier test, or now)
    beam = steps.compiled_step(model, 3, True)
    assert greedy is not None and beam is not None and greedy.inputs != beam.inputs
    package = steps.step_package(model, 3, True)
    kept = package.with_name("kept.pt2")
    files.move(package, kept)
    files.move(package.with_suffix(".unpacked"), kept.with_suffix(".unpacked"))
    files.copy(steps.step_package(model, 1, True), package)  # greedy's step under beam 3's key
    notes = []
    try:
        steps._BUILT.pop(model, None)  # (as a new process)
        assert steps.compiled_step(model, 3, True, warn=notes.append, may_build=False) is None
        texts = copy(4, seed=13, max_length=6).src
        eager = translate(model, tokenizer, texts, DecodeConfig(steps="eager"), beam_size=3)
        assert translate(model, tokenizer, texts, DecodeConfig(steps="compiled"), beam_size=3) == eager
    finally:
        package.unlink()
        files.rmtree(package.with_suffix(".unpacked"), ignore_errors=True)
        files.move(kept, package)
        files.move(kept.with_suffix(".unpacked"), package.with_suffix(".unpacked"))
        steps._BUILT.pop(model, None)
    said = f"takes {greedy.inputs} inputs where this attnkit passes {beam.inputs}"
    assert len(notes) == 1 and said in notes[0] and "attnkit cache clear" in notes[0]
