"""Text in, text out (decode/translate.py): the n best translations with their scores."""

import pytest
import torch

from attnkit import build_transformer
from attnkit.config import DecodeConfig
from attnkit.data.synthetic import copy
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.translate import translate
from attnkit.models.config import TransformerConfig


@pytest.fixture(scope="module")
def model_and_tokenizer():
    """A random model (its hypotheses differ in length and score) that never finds <unk> likely, so that
    every translation encodes back to the ids it was found as."""
    tokenizer = Tokenizer.train("word", copy(300, seed=0, max_length=6).src)
    torch.manual_seed(5)
    model = build_transformer(TransformerConfig.from_preset("tiny", output_bias=True), tokenizer.vocab_size)
    with torch.no_grad():
        model.generator.proj.bias[tokenizer.specials.unk] = -1e4
    return model.eval(), tokenizer


def _log_probability(
    model, tokenizer, source: str, target: str, ended: bool = True, never: tuple[int, ...] = ()
) -> float:
    """log P(target </s> | source </s>), teacher-forced in float64: the sum of each token's log-softmax;
    ``ended=False``: of the target alone (no </s>); ``never``: tokens taken out of every distribution
    (their logits -inf before the softmax)."""
    s = tokenizer.specials
    src = torch.tensor([[*tokenizer.encode(source), s.eos]])
    out = [*tokenizer.encode(target), s.eos]
    tgt_in = torch.tensor([[s.bos, *out[:-1]]])
    with torch.no_grad():
        logits = model.double()(src, tgt_in).float().double()  # (1, T, V)
    model.float()
    logits[..., list(never)] = float("-inf")
    log_probs = logits.log_softmax(-1)[0, torch.arange(len(out)), torch.tensor(out)]
    return float(log_probs.sum() if ended else log_probs[:-1].sum())


@pytest.mark.parametrize(("penalty", "alpha"), [("length", 1.0), ("gnmt", 0.6), ("length", 0.0)])
def test_n_best_scores_are_each_translations_normalised_log_probability(model_and_tokenizer, penalty, alpha):
    """A score is log P(Y|X) / lp(|Y|), |Y| counting </s> (search.py): lp = |Y|^α, or GNMT's
    ((5 + |Y|) / 6)^α (Wu et al., 2016, eq. 14), recomputed here from a teacher-forced pass."""
    model, tokenizer = model_and_tokenizer
    texts = copy(6, seed=2, max_length=6).src
    decode = DecodeConfig(batch_size=4, streams=1, length_penalty=penalty, alpha=alpha)
    found = translate(model, tokenizer, texts, decode, n_best=3, beam_size=4)
    assert translate(model, tokenizer, texts, decode, beam_size=4) == [best[0][0] for best in found]
    assert len({len(translation.split()) for best in found for translation, *_ in best}) > 2  # lengths vary
    for text, best in zip(texts, found, strict=True):
        assert len(best) == 3 and [score for _, score, _ in best] == sorted(
            (score for _, score, _ in best), reverse=True
        )
        for translation, score, tokens in best:
            assert tokens == len(tokenizer.encode(translation))  # the ids it was found as, </s> not counted
            length = tokens + 1
            lp = length**alpha if penalty == "length" else ((5 + length) / 6) ** alpha
            assert score == pytest.approx(
                _log_probability(model, tokenizer, text, translation) / lp, abs=1e-4
            )


def test_one_best_of_a_beam_of_one_is_greedy_searchs_translation(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    texts = [*copy(8, seed=3, max_length=6).src, ""]
    decode = DecodeConfig(batch_size=4, streams=1)
    found = translate(model, tokenizer, texts, decode, n_best=1, beam_size=1)
    assert [best[0][0] for best in found[:-1]] == translate(model, tokenizer, texts, decode, beam_size=1)[:-1]
    assert found[-1] == []  # an empty line: no hypotheses
    with pytest.raises(ValueError, match=r"n_best \(3\) must not exceed the beam size \(2\)"):
        translate(model, tokenizer, texts, decode, n_best=3, beam_size=2)


def test_ctranslate2s_n_best_scores_follow_its_own_formula(model_and_tokenizer, tmp_path):
    """CTranslate2's score (decode/ct2.py): log P'(Y) / |Y|^α, P' the model's distribution without <pad>
    and <s> (CTranslate2 takes them out before the softmax), Y ending in </s>, or cut at the length bound
    without it; recomputed here from a teacher-forced pass."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is the optional engine")
    from attnkit.convert.export import export_ctranslate2
    from attnkit.decode.ct2 import CTranslate2Translator

    model, tokenizer = model_and_tokenizer
    s = tokenizer.specials
    texts = copy(6, seed=2, max_length=6).src
    decode = DecodeConfig(batch_size=1, streams=1, alpha=0.8)  # one line a batch: its own length bound
    folder = export_ctranslate2(model, tokenizer, vars(decode), tmp_path / "ct2")
    found = CTranslate2Translator(folder).translate_n_best(texts, 3, beam_size=4)
    kinds = set()
    for text, best in zip(texts, found, strict=True):
        assert len(best) == 3
        for translation, score, tokens in best:
            length = len(tokenizer.encode(translation))
            assert tokens == length  # the ids CTranslate2 found it as, </s> not counted
            cut = length == int(1.5 * (len(tokenizer.encode(text)) + 1) + 10) - 1  # at the bound: no </s>
            kinds.add(cut)
            expected = _log_probability(model, tokenizer, text, translation, not cut, (s.pad, s.bos))
            assert score == pytest.approx(expected / (length + (not cut)) ** 0.8, abs=1e-4)
    assert kinds == {True, False}  # both kinds of hypotheses were scored


def test_without_a_cpp_compiler_a_large_input_says_what_the_models_own_steps_cost(
    model_and_tokenizer, monkeypatch
):
    """``decode.steps=auto`` builds compiled steps for an input large enough to repay them; where no C++
    compiler is found it says so in one line, with what the model's own steps cost, and translates
    with them (building nothing)."""
    import torch._inductor.config as inductor

    from attnkit.cpu.compiled.build import missing_compiler
    from attnkit.decode import starts
    from attnkit.decode.translate import Reporting

    # the compiler AOTInductor is told of, changed through its config's own patch (a monkeypatch of the
    # config's attribute, once undone, left it missing for the rest of the session)
    with inductor.patch({"cpp.cxx": (None, "no-such-compiler++")}):
        said = missing_compiler()
        assert said is not None and "no C++ compiler (no-such-compiler++)" in said
        model, tokenizer = model_and_tokenizer
        texts = copy(12, seed=3, max_length=6).src
        expected = translate(model, tokenizer, texts, DecodeConfig(streams=1, steps="eager"), beam_size=2)
        monkeypatch.setattr(starts, "REPAYING_SENTENCES", len(texts))

        def building(*args):  # (model, beam, warn, start token, build): build, or look in the cache
            if args[-1]:
                pytest.fail("nothing is built")

        monkeypatch.setattr(starts, "compiled_decoding", building)
        notes = []
        auto = DecodeConfig(streams=1)
        assert (
            translate(model, tokenizer, texts, auto, beam_size=2, reporting=Reporting(warn=notes.append))
            == expected
        )
        assert notes == [f"decode.steps=auto: {said}; the model's own steps take {starts.EAGER_COST}"]
        notes.clear()  # a smaller input would not build them: nothing to say
        translate(model, tokenizer, texts[:-1], auto, beam_size=2, reporting=Reporting(warn=notes.append))
        assert notes == []
