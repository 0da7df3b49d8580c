"""Continuous batching (decode/continuous.py): each source gets what ``translate`` gives it alone,
whichever sources share its steps, join after it, or leave before it."""

from dataclasses import dataclass

import pytest
import torch

from attnkit import build_transformer
from attnkit.config import DecodeConfig
from attnkit.cpu import speed_up
from attnkit.cpu.compiled.trace import CachedStep, FirstStep, RankedStep
from attnkit.data.synthetic import copy
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.compiled import CompiledDecoding
from attnkit.decode.continuous import RunningGenerations, RunningTranslations
from attnkit.decode.generate import generate
from attnkit.decode.search import BeamSettings
from attnkit.decode.starts import SourceDecoding
from attnkit.decode.translate import translate
from attnkit.models.config import TransformerConfig


def _model(tokenizer: Tokenizer, **changes) -> torch.nn.Module:
    """A random model (its hypotheses differ in length and score) that never finds <unk> likely."""
    torch.manual_seed(5)
    config = TransformerConfig.from_preset("tiny", output_bias=True, **changes)
    model = build_transformer(config, tokenizer.vocab_size)
    with torch.no_grad():
        model.generator.proj.bias[tokenizer.specials.unk] = -1e4
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train("word", copy(300, seed=0, max_length=9).src)


def _alone(model, tokenizer, decode, text, beam, n_best):
    """What ``translate`` gives ``text`` in a batch of its own."""
    return translate(model, tokenizer, [text], decode, n_best=n_best, beam_size=beam)[0]


def _run(running: RunningTranslations, arrivals: dict[int, list], leaving: dict[int, set] | None = None):
    """Iterate until every source is done: ``arrivals[i]`` join at iteration i, ``leaving[i]`` leave."""
    done, i = {}, 0
    while i <= max(arrivals) or running.sources:
        for key, found in running.iterate(arrivals.get(i, []), (leaving or {}).get(i, set())):
            assert key not in done
            done[key] = found
        i += 1
        assert i < 500
    return done


def _assert_same(found, expected):
    assert [(text, tokens) for text, _, tokens in found] == [(text, tokens) for text, _, tokens in expected]
    for (_, score, _), (_, wanted, _) in zip(found, expected, strict=True):
        assert score == pytest.approx(wanted, abs=1e-5)


@pytest.mark.parametrize("changes", [{}, {"positions": "learned"}, {"copy": True}])
def test_sources_joining_at_any_step_get_their_translation_alone(tokenizer, changes):
    """Sources join a running batch at several steps, with other beams and n-best lists beside them
    (and an empty line): each gets exactly ``translate``'s translations of it alone, with its scores."""
    model = _model(tokenizer, **changes)
    decode = DecodeConfig(batch_size=64, streams=1)
    texts = copy(14, seed=3, max_length=9).src
    settings = [(4, 1), (4, 2), (1, 1), (3, 3)]
    arrivals: dict[int, list] = {}
    for n, text in enumerate(texts):  # two at the first step, then one or two every few steps
        beams = BeamSettings(*settings[n % len(settings)])
        arrivals.setdefault(0 if n < 2 else n // 2 + n % 3, []).append((n, text, beams))
    arrivals[3].append(("empty", "  ", BeamSettings(4, 1)))
    running = RunningTranslations(model, tokenizer, decode)
    done = _run(running, arrivals)
    assert done.pop("empty") == []
    assert sorted(done) == list(range(len(texts)))
    lengths = {len(found[0][0].split()) for found in done.values()}
    assert len(lengths) > 2  # the outputs differ in length: sources leave at different steps
    for n, text in enumerate(texts):
        beam, n_best = settings[n % len(settings)]
        _assert_same(done[n], _alone(model, tokenizer, decode, text, beam, n_best))
    assert running.rows == 0 and not running.running


def test_with_the_models_own_steps_sources_of_every_width_share_one_running_batch(tokenizer):
    """Only compiled steps need a running batch per padded source width; the model's own steps give
    each row its own keys whatever the width, so one batch serves every width (a batch per width made
    the server's steps several smaller ones: 0.6x the sentences per second at 32 clients)."""
    running = RunningTranslations(_model(tokenizer), tokenizer, DecodeConfig(batch_size=64, streams=1))
    short, long = "a b", " ".join(["a b c d e f g h i"] * 3)  # 3 and 28 tokens with </s>: widths 8, 32
    running.iterate([("short", short, BeamSettings(4, 1)), ("long", long, BeamSettings(4, 1))])
    assert list(running.running) == [(BeamSettings(4, 1), False)] and running.sources == 2


def test_sources_that_leave_change_nothing_for_the_others(tokenizer):
    """Sources taken out mid-search (their client gone) are not answered, and the others' translations
    are still their own."""
    model = _model(tokenizer)
    decode = DecodeConfig(batch_size=64, streams=1)
    texts = copy(8, seed=4, max_length=9).src
    arrivals = {0: [(n, text, BeamSettings(4, 1)) for n, text in enumerate(texts[:5])],
                2: [(n, text, BeamSettings(4, 1)) for n, text in enumerate(texts[5:], start=5)]}  # fmt: skip
    running = RunningTranslations(model, tokenizer, decode)
    done = _run(running, arrivals, leaving={1: {0, 3}, 3: {6}})
    assert sorted(done) == [1, 2, 4, 5, 7]
    for n in done:
        _assert_same(done[n], _alone(model, tokenizer, decode, texts[n], 4, 1))


def test_a_running_batch_narrows_its_sources_when_the_widest_has_left(tokenizer):
    """A running batch pads its sources to the widest that joined, and every step's attention scores
    each padded position: once the widest has left, the others narrow to their own widest (rounded up
    to KEY_BUCKET, 8), and their translations are still what each gets alone."""
    model = _model(tokenizer)
    decode = DecodeConfig(batch_size=64, streams=1)
    running = RunningTranslations(model, tokenizer, decode)
    short, long = copy(3, seed=6, max_length=5).src, " ".join(["a b c d e f g h i"] * 3)  # 28 with </s>
    beam = BeamSettings(4, 1)
    done = dict(running.iterate([(n, text, beam) for n, text in enumerate(short)] + [("long", long, beam)]))
    (batch,) = running.running.values()
    assert batch.decoding.memory.size(1) == 32 and not done
    done.update(running.iterate([], {"long"}))
    assert batch.sources, "the short sources are still searched"
    cross = batch.decoding.cache.layers[0].src_attn.key  # (N, h, S, d_k)
    widths = {batch.decoding.memory.size(1), batch.decoding.src_mask.size(-1), cross.size(2)}
    assert widths == {8}
    while running.sources:
        done.update(running.iterate([]))
    assert sorted(done) == [0, 1, 2]
    for n, text in enumerate(short):
        _assert_same(done[n], _alone(model, tokenizer, decode, text, 4, 1))


@pytest.mark.parametrize("fast_path", [False, True], ids=["paper's modules", "CPU fast path"])
def test_the_compiled_steps_as_traced_join_and_leave_as_the_models_own(tokenizer, fast_path):
    """With compiled steps (the traced first step and cached step, beam search's ranking too, run
    eagerly here: no compiler needed), sources that join the running batch's history at later steps,
    and leave it, still get ``translate``'s translations of them alone."""
    model = _model(tokenizer)
    if fast_path:
        speed_up(model)
    decode = DecodeConfig(batch_size=64, streams=1)
    taken = []

    def traced(beams):
        step = CachedStep(model) if beams == 1 else RankedStep(model, beams)  # (beam search's ranks)
        first = FirstStep(model)

        def counted(*tensors):
            taken.append(beams)
            return step(*tensors)

        return SourceDecoding(
            lambda src, use_cache=True: CompiledDecoding(
                model, src, use_cache, counted, beams, (first, tokenizer.specials.bos)
            ),
            compiled=True,
        )

    texts = copy(12, seed=6, max_length=9).src
    settings = [(4, 2), (1, 1), (4, 1)]
    arrivals: dict[int, list] = {}
    for n, text in enumerate(texts):
        arrivals.setdefault(n // 2 + n % 2, []).append((n, text, BeamSettings(*settings[n % len(settings)])))
    running = RunningTranslations(model, tokenizer, decode, decodings={1: traced(1), 4: traced(4)})
    done = _run(running, arrivals, leaving={3: {4}})
    assert sorted(done) == [n for n in range(len(texts)) if n != 4]
    for n in done:
        beam, n_best = settings[n % len(settings)]
        _assert_same(done[n], _alone(model, tokenizer, decode, texts[n], beam, n_best))
    assert taken.count(4) >= 5 and taken.count(1) >= 5  # the traced steps took the steps after the first


@dataclass
class Prompt:
    text: str
    seed: int
    sink: object = None


def test_prompts_joining_a_running_batch_are_continued_as_generate_continues_them_alone(
    model_and_tokenizer,
):
    """Prompts of different lengths join at several steps, sampled and greedy, with stop strings and
    streams beside them, and some leave: each is continued exactly as ``generate`` continues it alone
    with its seed, and a stream's pieces add up to its text."""
    model, tokenizer = model_and_tokenizer
    settings = {
        "sampled": DecodeConfig(max_new_tokens=14, temperature=0.9, top_k=6, batch_size=64, streams=1),
        "greedy": DecodeConfig(max_new_tokens=9, temperature=0.0, batch_size=64, streams=1),
        "stopped": DecodeConfig(max_new_tokens=14, temperature=1.0, stop=["e "], batch_size=64, streams=1),
    }
    texts = ["to be", "a", "now is the win", "the question", "all the", "w", "not to be, th", "s"]
    pieces: dict[int, list[str]] = {}
    arrivals: dict[int, list] = {}
    for n, text in enumerate(texts):
        name = list(settings)[n % 3]
        sink = pieces.setdefault(n, []).append if n % 2 else None
        arrivals.setdefault(n // 2 + n % 2, []).append((n, Prompt(text, 100 + n, sink), name))
    settings["alone"] = DecodeConfig(max_new_tokens=14, temperature=0.5, batch_size=64, streams=1)
    arrivals[1].append(("lonely", Prompt("to", 7), "alone"))  # its running batch empties when it leaves
    running = RunningGenerations(model, tokenizer, settings.__getitem__)
    done = _run(running, arrivals, leaving={2: {0, "lonely"}})
    assert sorted(done) == list(range(1, len(texts)))
    assert len({len(text) for text in done.values()}) >= 2  # they end at different steps
    for n in done:
        decode = settings[list(settings)[n % 3]]
        (alone,) = generate(model, tokenizer, [texts[n]], decode, seeds=[100 + n])
        assert done[n] == alone
        if n % 2:
            assert "".join(pieces[n]) == alone
    assert running.rows == 0 and not running.running


def test_a_model_as_built_and_left_training_serves_each_source_its_translation_alone(tokenizer):
    """A running batch of a model as it was built (a library user's own: torch's own linear maps, left
    in training mode with dropout): each source gets exactly ``translate``'s translations of it alone,
    scores to the last bit, because a running batch searches the model as ``translate`` does (in eval
    mode, with attnkit's kernels). Before, dropout changed every step, and the batch the sums."""
    torch.manual_seed(5)
    config = TransformerConfig.from_preset("tiny", dropout=0.3, d_model=256, d_ff=1024)
    model = build_transformer(config, tokenizer.vocab_size)  # in training mode, as built
    texts = copy(12, seed=4, max_length=9).src
    arrivals: dict[int, list] = {}
    for n, text in enumerate(texts):
        arrivals.setdefault(n // 3, []).append((n, text, BeamSettings(3, 2)))
    done = _run(RunningTranslations(model, tokenizer, DecodeConfig(batch_size=64, streams=1)), arrivals)
    for n, text in enumerate(texts):
        assert done[n] == _alone(model, tokenizer, DecodeConfig(), text, 3, 2), text
