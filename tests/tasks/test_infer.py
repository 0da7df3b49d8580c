"""``Task.infer``: what a model trained on each task makes of new inputs, one line per input, each
checked against the model's own outputs computed directly (the argmax of its logits, its search)."""

import pytest
import torch

from attnkit.config import RunConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.generate import generate
from attnkit.decode.translate import translate
from attnkit.errors import AttnkitError
from attnkit.models import build_model
from attnkit.tasks import task_of
from attnkit.tasks.span_qa import answer

WORDS = [
    "the",
    "a",
    "film",
    "was",
    "good",
    "bad",
    "plot",
    "story",
    "paris",
    "london",
    "is",
    "capital",
    "of",
    "france",
    "england",
]
SENTENCES = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]


def _tokenizer(mask: bool = False) -> Tokenizer:
    return Tokenizer.train("word", SENTENCES, 100, mask=mask)


def _config(model: dict, data: dict, **decode) -> RunConfig:
    return RunConfig.from_dict({"model": model, "data": data, "decode": {"max_len_a": 0, **decode}})


def _built(config: RunConfig, tokenizer: Tokenizer | None):
    torch.manual_seed(0)
    if tokenizer is not None:
        config.model.pad_id = tokenizer.specials.pad
    model = build_model(config.model, None if tokenizer is None else tokenizer.vocab_size).eval()
    return model


def test_translation_and_summarisation_infer_by_the_runs_search():
    tokenizer = _tokenizer()
    config = _config({"preset": "tiny"}, {"task": "parallel"}, max_len_b=6, beam_size=2)
    model = _built(config, tokenizer)
    lines = SENTENCES[:5]
    assert task_of(config).infer(model, tokenizer, config, lines, "cpu") == translate(
        model, tokenizer, lines, config.decode
    )
    summary = _config({"preset": "tiny"}, {"task": "summarise", "max_source_len": 4}, max_len_b=6)
    model = _built(summary, tokenizer)
    cut = [
        " ".join(line.split()[:3]) for line in lines
    ]  # 4 tokens with </s>; a word tokenizer: a token a word
    infer = task_of(summary).infer
    assert infer(model, tokenizer, summary, lines, "cpu") == infer(model, tokenizer, summary, cut, "cpu")
    assert infer(model, tokenizer, summary, lines, "cpu") == translate(model, tokenizer, cut, summary.decode)


def test_language_modelling_infers_continuations():
    tokenizer = _tokenizer()
    config = _config({"preset": "tiny-decoder"}, {"task": "text"}, max_new_tokens=5)
    model = _built(config, tokenizer)
    prompts = ["the film", "paris is"]
    got = task_of(config).infer(model, tokenizer, config, prompts, "cpu")
    assert got == generate(model, tokenizer, prompts, config.decode) and len(got) == 2


def test_classification_infers_the_most_probable_label_and_its_probability():
    tokenizer = _tokenizer()
    config = _config({"preset": "tiny-encoder", "head": "classify", "num_labels": 3},
                     {"task": "classify", "labels": ["neg", "pos", "mixed"]})  # fmt: skip
    model = _built(config, tokenizer)
    lines = SENTENCES[:4]
    rows = task_of(config).infer(model, tokenizer, config, lines, "cpu")
    specials = tokenizer.specials
    for line, row in zip(lines, rows, strict=True):
        ids = torch.tensor([[specials.bos, *tokenizer.encode(line), specials.eos]])
        with torch.no_grad():
            p = model(ids).softmax(-1)[0]
        label, probability = row.split("\t")
        assert label == config.data.labels[int(p.argmax())] and float(probability) == pytest.approx(
            float(p.max()), abs=1e-4
        )


def test_span_qa_infers_answers_and_names_a_line_without_a_tab():
    tokenizer = _tokenizer()
    config = _config({"preset": "tiny-encoder", "head": "span"}, {"task": "qa"})
    model = _built(config, tokenizer)
    lines = ["what is the capital of france\tparis is the capital of france", "film\tthe film was good"]
    got = task_of(config).infer(model, tokenizer, config, lines, "cpu")
    questions, passages = zip(*(line.split("\t") for line in lines), strict=True)
    assert got == answer(model, tokenizer, list(questions), list(passages))
    with pytest.raises(AttnkitError, match=r"^questions\.txt:2: no tab"):
        task_of(config).infer(
            model, tokenizer, config, [lines[0], "no tab here"], "cpu", where="questions.txt"
        )


def test_masked_lm_fills_each_mask_with_the_most_probable_token():
    tokenizer = _tokenizer(mask=True)
    config = _config({"preset": "tiny-encoder", "head": "mlm"}, {"task": "mlm"})
    model = _built(config, tokenizer)
    lines = ["paris is the <mask> of france", "the <mask> was <mask>"]
    rows = task_of(config).infer(model, tokenizer, config, lines, "cpu")
    specials = tokenizer.specials
    for line, row in zip(lines, rows, strict=True):
        words = [specials.mask if w == "<mask>" else tokenizer.encode(w)[0] for w in line.split()]
        ids = torch.tensor([[specials.bos, *words, specials.eos]])  # a word tokenizer: a token a word
        masks = ids == specials.mask
        with torch.no_grad():
            p = model(ids, select=masks).softmax(-1)  # (masks, V)
        fields = row.split("\t")
        assert len(fields) == 2 * int(masks.sum())
        for k in range(len(p)):
            best = int(p[k].argmax())
            assert fields[2 * k] == (tokenizer.decode([best]) or tokenizer.hf.id_to_token(best))
            assert float(fields[2 * k + 1]) == pytest.approx(float(p[k].max()), abs=1e-4)
    with pytest.raises(AttnkitError, match=r"^--text:1: no <mask> to fill"):
        task_of(config).infer(model, tokenizer, config, ["nothing masked"], "cpu", where="--text")


@pytest.mark.parametrize("arch", ["glimpse", "whole-image"])
def test_image_classification_names_each_images_digit(arch):
    config = _config({"arch": arch, "image_size": 20}, {"task": "cluttered-digits", "canvas": 20})
    model = _built(config, None)
    images = [torch.randint(0, 256, (20, 20), dtype=torch.uint8) for _ in range(5)]
    got = task_of(config).infer(model, None, config, images, "cpu")
    with torch.no_grad():
        expected = model(torch.stack(images).unsqueeze(1).float() / 255).argmax(-1)
    assert got == [str(d) for d in expected.tolist()]
    with pytest.raises(AttnkitError, match=r"^input:2: an image of \(10, 20\); this model reads \(20, 20\)"):
        task_of(config).infer(model, None, config, [images[0], images[1][:10]], "cpu")


def test_a_bad_input_is_named_by_its_line_in_the_whole_file_when_given_a_part():
    from attnkit.tasks.span_qa import SpanQATask

    with pytest.raises(AttnkitError, match=r"^q\.tsv:8: no tab; a question-answering input"):
        SpanQATask.infer(
            None, None, None, ["who?\tAda was here.", "no tab here"], "cpu", where="q.tsv", first=7
        )
