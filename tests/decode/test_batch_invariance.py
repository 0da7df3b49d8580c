"""A sentence's translation is a function of the sentence and the settings alone (docs/invariance.md):
decoded alone or among random batchmates of other lengths, in any batch size, in every precision, its
n best translations and their scores are the same to the last bit, and so are the logits of each
decoding step."""

from __future__ import annotations

import dataclasses
import random
import shutil

import pytest
import torch

from attnkit import build_transformer
from attnkit.config import load_run_config
from attnkit.cpu.compiled.library import CompiledStep
from attnkit.cpu.linear import _packing_works
from attnkit.data.batching import pad
from attnkit.data.synthetic import copy
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.compiled import WIDTH_BUCKET, compiled_decoding
from attnkit.decode.continuous import RunningTranslations
from attnkit.decode.generate import generate
from attnkit.decode.search import BeamSettings
from attnkit.decode.translate import translate
from attnkit.loading import ready_for_inference
from attnkit.models import build_model, evaluating, from_preset
from attnkit.models.config import TransformerConfig
from attnkit.models.decoding import Seq2SeqDecoding

PRECISIONS = ["fp32", "bf16", "int8"]
# wide enough that the linear maps take both of float32's kernels (256 x 256: F.linear; 1024 x 256:
# oneDNN), short outputs so that a random model's searches end soon
MODEL = {"d_model": 256, "d_ff": 1024, "h": 4, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.0}
SETTINGS = ["decode.max_len_a=0", "decode.max_len_b=8"]


@pytest.fixture(scope="module")
def sentences():
    """30 sources of 1 to 16 words, in no order."""
    data = copy(400, seed=3, max_length=16)
    return data, list(dict.fromkeys(data.src))[:30]


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """One cache folder for the module's compiled steps (a precision's first step is built once)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg_cache")))
        yield


def _model(data, precision: str, **changes):
    tokenizer = Tokenizer.train("word", data.src)
    torch.manual_seed(7)
    config = TransformerConfig.from_preset("tiny", **{**MODEL, **changes})
    model = build_transformer(config, tokenizer.vocab_size)
    config = load_run_config(None, [f"decode.precision={precision}", *SETTINGS])
    model = ready_for_inference(model, config)
    return model, tokenizer, config


def _random_batches(n: int, rng: random.Random) -> list[list[int]]:
    """The indices ``0 .. n-1`` shuffled, in batches of 2 to ``n`` of them."""
    order = rng.sample(range(n), n)
    batches = []
    while order:
        size = rng.randint(2, max(2, len(order)))
        batches.append(order[:size])
        order = order[size:]
    return batches


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("beam", [1, 3, 4])
def test_a_sentence_is_translated_alike_alone_and_in_any_batch(sentences, precision, beam):
    data, texts = sentences
    model, tokenizer, config = _model(data, precision)
    packs = precision != "bf16" or _packing_works(torch.bfloat16)  # else float32 (and the config says so)
    assert config.decode.precision == (precision if packs else "fp32")

    def translated(group: list[str], batch_size: int, streams: int = 0) -> list:
        decode = dataclasses.replace(config.decode, batch_size=batch_size, streams=streams)
        return translate(model, tokenizer, group, decode, n_best=beam, beam_size=beam)

    alone = translated(texts, 1)
    rng = random.Random(beam)
    for round_ in range(3):  # three ways of cutting the same sentences into batches
        found = [None] * len(texts)
        for batch in _random_batches(len(texts), rng):
            group = translated([texts[i] for i in batch], len(batch), streams=round_ % 2 * 2)
            for i, hypotheses in zip(batch, group, strict=True):
                found[i] = hypotheses
        differ = [(texts[i], alone[i], found[i]) for i in range(len(texts)) if found[i] != alone[i]]
        assert not differ, f"{len(differ)} of {len(texts)} differ, e.g. {differ[0]}"
    assert len({len(text.split()) for text in texts}) >= 12  # mixed lengths: padding in every batch
    scores = {score for hypotheses in alone for _, score, _ in hypotheses}
    assert len(scores) > len(texts) // 2  # not one answer


@pytest.mark.parametrize("threads", [1, 2])
def test_a_model_as_built_is_searched_alike_alone_and_in_any_batch(sentences, threads):
    """A model searched as it was built (neither loaded nor readied: a library user's own): its
    translations and a decoder's continuations are the same alone and in batches, because a search
    gives it attnkit's CPU kernels; with torch's own ``F.linear``, whose sums depend on the number of
    rows, most sentences' scores differed."""
    data, texts = sentences
    tokenizer = Tokenizer.train("word", data.src)
    torch.manual_seed(7)
    model = build_transformer(TransformerConfig.from_preset("tiny", **MODEL), tokenizer.vocab_size)
    decode = load_run_config(None, ["decode.precision=fp32", *SETTINGS]).decode
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:

        def translated(group: list[str]) -> list:
            batch = dataclasses.replace(decode, batch_size=len(group))
            return translate(model, tokenizer, group, batch, n_best=3, beam_size=3)

        alone = [translated([text])[0] for text in texts]
        for batch in _random_batches(len(texts), random.Random(threads)):
            assert translated([texts[i] for i in batch]) == [alone[i] for i in batch], batch

        decoder, tokenizer = _decoder(None)
        prompts = [LINE[i : i + 1 + 3 * (i % 5)] for i in range(0, 48, 4)]
        greedy = load_run_config(None, ["decode.temperature=0", "decode.max_new_tokens=12"]).decode

        def continued(rows: list[int]) -> list[str]:
            batch = dataclasses.replace(greedy, batch_size=len(rows))
            return generate(decoder, tokenizer, [prompts[i] for i in rows], batch, seeds=rows)

        first = [continued([i])[0] for i in range(len(prompts))]
        for batch in _random_batches(len(prompts), random.Random(threads)):
            assert continued(batch) == [first[i] for i in batch], batch
    finally:
        torch.set_num_threads(previous)


needs_compiler = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None,
    reason="compiling the step needs a C++ compiler (apt-get install g++)",
)


@needs_compiler
@pytest.mark.parametrize(
    ("precision", "beam"),
    # each precision in the fast set (a step compiled for each: about 20 s); greedy's own step in the slow
    [("fp32", 4), ("bf16", 4), ("int8", 4), pytest.param("bf16", 1, marks=pytest.mark.slow)],
)
def test_compiled_steps_translate_a_sentence_alike_alone_and_in_any_batch(
    sentences, compile_cache, precision, beam, monkeypatch
):
    """``decode.steps=compiled``: the compiled first step (the encoder) and the steps after it give each
    source its own bits at any wider padded width, so that a batch, and a running batch, holds sources
    of every width."""
    data, texts = sentences
    # a one-layer decoder and fewer sentences: compiling is most of the time; two long sources too
    texts = [*texts[:14], " ".join(texts[14:17]), " ".join(texts[17:22])]
    widths = {-(-(len(text.split()) + 1) // WIDTH_BUCKET) for text in texts}  # words are tokens here
    assert len(widths) >= 3, widths
    model, tokenizer, config = _model(data, precision, encoder_layers=1, decoder_layers=1)
    calls, run = [0], CompiledStep.__call__

    def counted(step, *tensors):
        calls[0] += 1
        return run(step, *tensors)

    monkeypatch.setattr(CompiledStep, "__call__", counted)

    def translated(group: list[str], batch_size: int, streams: int = 0) -> list:
        decode = dataclasses.replace(config.decode, batch_size=batch_size, streams=streams, steps="compiled")
        return translate(model, tokenizer, group, decode, n_best=beam, beam_size=beam)

    alone = translated(texts, 1)
    assert calls[0] > len(texts)  # the compiled steps ran
    rng = random.Random(beam)
    for round_ in range(2):
        found = [None] * len(texts)
        for batch in _random_batches(len(texts), rng):
            group = translated([texts[i] for i in batch], len(batch), streams=round_ * 2)
            for i, hypotheses in zip(batch, group, strict=True):
                found[i] = hypotheses
        differ = [(texts[i], alone[i], found[i]) for i in range(len(texts)) if found[i] != alone[i]]
        assert not differ, f"{len(differ)} of {len(texts)} differ, e.g. {differ[0]}"
    # and joining a running batch (the server's continuous batching) at any step; in bf16 with one
    # stream, whose steps are built with loops that share the threads: the same bits as the serial ones
    streams = 1 if precision == "bf16" else 0
    decode = dataclasses.replace(config.decode, batch_size=1, streams=streams, steps="compiled")
    calls[0] = 0
    running, batches = RunningTranslations(model, tokenizer, decode), []
    iterate = running.iterate

    def counted_batches(*args):
        out = iterate(*args)
        batches.append(len(running.running))
        return out

    running.iterate = counted_batches
    done = _run_joining(running, texts, [(beam, beam)])
    assert {n: done[n] for n in range(len(texts))} == dict(enumerate(alone))
    assert calls[0] > len(texts)
    assert max(batches) == 1  # one running batch for sources of every width


@needs_compiler
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("first_step", ["alone", "together"])
def test_a_compiled_step_gives_a_source_the_same_bits_beside_wider_sources(
    sentences, compile_cache, precision, first_step
):
    """The compiled steps attend over every key of the batch's widest source, padded to whole vectors
    of the compiler's sums; a source gets its own logits at any wider width (its extra keys weigh
    exactly 0, and the sums over keys run in the same order: docs/invariance.md). The first step (the
    encoder) runs on each source alone, then they are merged into one batch (a server's newcomers
    joining at different steps), or on the batch's sources together, padded to the widest; then they
    are decoded together."""
    data, texts = sentences
    model, tokenizer, _ = _model(data, precision, encoder_layers=1, decoder_layers=1)  # as above: cached
    specials, beams = tokenizer.specials, 4
    # and two long ones (150 and 240 words): torch's fused attention, which the compiled encoder took
    # before, gave a 151-key row other bits at 256 keys than at 160
    words = " ".join(texts).split()
    texts = [
        *texts[:6],
        " ".join(texts[6:9]),
        " ".join(texts[9:14]),
        " ".join(words[:150]),
        " ".join(words[:240]),
    ]
    sources_ids = [[*tokenizer.encode(text), specials.eos] for text in texts]
    assert len({-(-len(ids) // WIDTH_BUCKET) for ids in sources_ids}) >= 5  # five widths at least
    with evaluating(model):
        decoding = compiled_decoding(model, beams, start_token=specials.bos)
    assert decoding is not None
    generator = torch.Generator().manual_seed(0)
    steps = torch.randint(4, tokenizer.vocab_size, (len(texts) * beams, 3), generator=generator)
    beam_scores = torch.randn(len(texts), beams, generator=generator) - 3  # each source's beams'
    running = torch.zeros(len(texts) * beams, dtype=torch.bool)  # no row at its length bound

    def ranked(sources: list[int]) -> torch.Tensor:
        """Each source's best 2·beams continuations at 3 steps after the first (the compiled step ranks
        them: their scores, and beam·V + token), its ``beams`` rows fed the same tokens whatever the
        batch: ``(len(sources), 3, 2, 2·beams)``, the scores' bits as integers."""
        decodings = []
        with torch.no_grad():
            for group in [[i] for i in sources] if first_step == "alone" else [sources]:
                started = decoding(
                    pad([sources_ids[i] for i in group], specials.pad, WIDTH_BUCKET, model.config.max_len)
                )
                started.next_logits(torch.full((len(group), 1), specials.bos))  # the first step, the encoder
                started.repeat(beams)
                decodings.append(started)
            joined = decodings[0]
            for other in decodings[1:]:
                joined.merge(other)
            tokens = torch.full((len(sources) * beams, 1), specials.bos)
            fed = torch.cat([steps[i * beams : (i + 1) * beams] for i in sources])  # (len · beams, 3)
            out = []
            for step in range(3):
                tokens = torch.cat([tokens, fed[:, step : step + 1]], dim=1)
                best, beam, token = joined.ranked(
                    tokens, running[: len(tokens)], specials, beam_scores[sources], 2 * beams
                )  # (len(sources), 2·beams) each
                out.append(
                    torch.stack([best.view(torch.int32).long(), beam * tokenizer.vocab_size + token], 1)
                )
        assert joined.history is not None  # the compiled step took the steps
        return torch.stack(out, dim=1)

    alone = torch.cat([ranked([i]) for i in range(len(texts))])  # (N, 3, 2, 2·beams)
    everyone = list(range(len(texts)))  # the long ones beside the short: widths 160 and 256 at 256
    for batch in [everyone, *_random_batches(len(texts), random.Random(2))]:
        assert torch.equal(ranked(batch), alone[batch]), f"batch of {len(batch)}: continuations differ"


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("copy_mechanism", [False, True], ids=["", "copy"])
def test_each_decoding_steps_logits_are_the_same_bits_whatever_the_batch(
    sentences, precision, copy_mechanism
):
    """The summarisers' copy mechanism too (its pointer attends to the source once more)."""
    data, texts = sentences
    model, tokenizer, _ = _model(data, precision, copy=copy_mechanism)
    specials = tokenizer.specials
    sources = [[*tokenizer.encode(text), specials.eos] for text in texts]
    steps = torch.randint(
        4, tokenizer.vocab_size, (len(texts), 3), generator=torch.Generator().manual_seed(0)
    )

    def logits(rows: list[int]) -> list[torch.Tensor]:
        """The logits of 3 steps of ``rows``' sources, fed the same tokens: ``(len(rows), 3, V)``."""
        with torch.no_grad():
            decoding = Seq2SeqDecoding(model, pad([sources[i] for i in rows], specials.pad), use_cache=True)
            tokens = torch.full((len(rows), 1), specials.bos)
            out = []
            for step in range(3):
                out.append(decoding.next_logits(tokens))  # (len(rows), V)
                tokens = torch.cat([tokens, steps[rows, step : step + 1]], dim=1)
        return torch.stack(out, dim=1)

    alone = torch.cat([logits([i]) for i in range(len(texts))])  # (N, 3, V)
    for batch in _random_batches(len(texts), random.Random(1)):
        batched = logits(batch)
        assert torch.equal(batched, alone[batch]), f"batch of {len(batch)}: logits differ"


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_source_joining_a_running_batch_at_any_step_gets_the_same_bits_as_alone(sentences, precision):
    """Continuous batching (the server's): sources join at several steps, with other beams beside them;
    each gets exactly the n best, scores to the last bit, that ``translate`` gives it alone."""
    data, texts = sentences
    model, tokenizer, config = _model(data, precision)
    decode = dataclasses.replace(config.decode, batch_size=1, streams=1)
    settings = [(4, 2), (1, 1), (4, 4)]
    done = _run_joining(RunningTranslations(model, tokenizer, decode), texts[:18], settings)
    for n, text in enumerate(texts[:18]):
        beam, n_best = settings[n % len(settings)]
        alone = translate(model, tokenizer, [text], decode, n_best=n_best, beam_size=beam)[0]
        assert done[n] == alone, (n, text)


def _run_joining(running: RunningTranslations, texts: list[str], settings: list[tuple[int, int]]) -> dict:
    """Each text's translations by ``running``: three join at the first step, then one or two every step
    or two, text n with ``settings[n % len(settings)]`` (beam, n_best)."""
    arrivals: dict[int, list] = {}
    for n, text in enumerate(texts):
        arrivals.setdefault(0 if n < 3 else n // 2 + n % 3, []).append(
            (n, text, BeamSettings(*settings[n % len(settings)]))
        )
    done, step = {}, 0
    while step <= max(arrivals) or running.sources:
        done.update(running.iterate(arrivals.get(step, [])))
        step += 1
    return done


LINE = "to be or not to be, that is the question; all the world's a stage"  # a decoder's characters


def _decoder(precision: str | None):
    """A small GPT and its characters' tokenizer, readied for inference in ``precision`` (None: as
    built, in training mode, neither loaded nor readied: a library user's own)."""
    tokenizer = Tokenizer.train("char", [LINE])
    torch.manual_seed(3)
    preset = from_preset("tiny-decoder", max_len=64, d_model=128, d_ff=512, h=4)
    model = build_model(preset, tokenizer.vocab_size)
    if precision is None:
        return model, tokenizer
    config = load_run_config(None, [f"decode.precision={precision}"])
    return ready_for_inference(model.eval(), config), tokenizer


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_prompts_logits_are_the_same_bits_alone_and_padded_on_the_left_among_others(precision):
    """A decoder-only model's prompts of several lengths, padded on the left as ``generate`` pads them:
    the logits of the prompt's last position and of the steps after it are a prompt's alone."""
    model, tokenizer = _decoder(precision)
    prompts = [
        tokenizer.encode(text) for text in ["to be", "all the world", "t", "that is the question", "or"]
    ]
    follow = torch.randint(
        4, tokenizer.vocab_size, (len(prompts), 2), generator=torch.Generator().manual_seed(0)
    )

    def logits(rows: list[int]) -> torch.Tensor:
        """``(len(rows), 3, V)``: after the prompt, then after each of two more tokens."""
        longest = max(len(prompts[i]) for i in rows)
        ids = torch.tensor([[0] * (longest - len(prompts[i])) + prompts[i] for i in rows])  # (B, T)
        valid = torch.tensor([[False] * (longest - len(prompts[i])) + [True] * len(prompts[i]) for i in rows])
        padded = not bool(valid.all())
        caches, out = model.new_caches(), []
        with torch.no_grad():
            positions = (valid.cumsum(1) - 1).clamp(min=0)  # each prompt's own positions
            out.append(model(ids, valid if padded else None, positions, caches)[:, -1])
            for step in range(2):
                valid = torch.cat([valid, torch.ones(len(rows), 1, dtype=torch.bool)], dim=1)
                positions = positions[:, -1:] + 1
                new = follow[rows, step : step + 1]
                out.append(model(new, valid if padded else None, positions, caches)[:, -1])
        return torch.stack(out, dim=1)

    alone = torch.cat([logits([i]) for i in range(len(prompts))])
    for batch in ([0, 1], [3, 2, 4], [4, 3, 2, 1, 0], [1, 1, 2]):
        got = logits(batch)
        assert torch.equal(got, alone[batch]), (batch, (got != alone[batch]).any(-1))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_a_prompt_is_continued_alike_alone_and_in_any_batch(precision, temperature):
    """``generate``, greedy and sampled (each prompt from its own seed), prompts of mixed lengths."""
    model, tokenizer = _decoder(precision)
    line = "to be or not to be, that is the question; all the world's a stage"
    prompts = [line[i : i + 1 + 3 * (i % 5)] for i in range(0, 48, 4)]  # 1 to 13 characters
    settings = [
        f"decode.precision={precision}",
        f"decode.temperature={temperature}",
        "decode.max_new_tokens=12",
    ]
    decode = load_run_config(None, settings).decode

    def continued(rows: list[int]) -> list[str]:
        batch = dataclasses.replace(decode, batch_size=len(rows))
        return generate(model, tokenizer, [prompts[i] for i in rows], batch, seeds=rows)

    alone = [continued([i])[0] for i in range(len(prompts))]
    for batch in _random_batches(len(prompts), random.Random(5)):
        assert continued(batch) == [alone[i] for i in batch], batch
    assert len(set(alone)) > len(prompts) // 2  # not one continuation for all
