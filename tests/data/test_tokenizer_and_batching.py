"""Tokenisers round-trip text with fixed special ids; token batches are complete, bounded, repeatable."""

import os
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from attnkit.data.batching import make_batch, token_batches
from attnkit.data.readers import read_parallel
from attnkit.data.synthetic import dates
from attnkit.data.tokenizer import SpecialIds, Tokenizer
from attnkit.errors import DataError

DATA = Path(os.environ.get("ATTNKIT_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data")
MULTI30K = DATA / "multi30k"


def test_joint_bpe_round_trips_real_german_and_english():
    if not MULTI30K.is_dir():
        pytest.skip(f"Multi30k not found at {MULTI30K}; set ATTNKIT_DATA to a folder holding multi30k/")
    pairs = read_parallel(MULTI30K / "val.de.gz", MULTI30K / "val.en.gz")
    tokenizer = Tokenizer.train("bpe", pairs.src + pairs.tgt, vocab_size=3000)
    assert 2000 < tokenizer.vocab_size <= 3000
    for text in pairs.src[:50] + pairs.tgt[:50]:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def _corpus() -> list[str]:
    """English-like sentences the test makes itself (no data set needed)."""
    subjects = ["the cat", "a dog", "my neighbour", "the old man", "two children"]
    verbs = ["sees", "likes", "walks past", "paints", "waits for"]
    objects = ["the house", "a red car", "the river", "their friends", "the market"]
    return [f"{s} {v} {o}." for s in subjects for v in verbs for o in objects] * 4


HARD_TEXTS = [
    "the café is naïve 😀",  # accents and an emoji, which a BPE without byte fallback loses
    "日本語のテキストと中文",  # CJK, never seen in training
    "e\u0301 and a\u0308: combining marks",  # e + combining acute, a + combining diaeresis
    "Straße, Ångström, ΑΒΓ, кириллица",
    "a literal </s> and <s> and <pad> are text",
    "▁ and Ġ are ordinary characters",
    "  leading, double  spaces and trailing ",
    "tab\tand\r\nline breaks",
    "",
]


def test_bpe_learns_merges_from_text_the_test_makes():
    tokenizer = Tokenizer.train("bpe", _corpus(), vocab_size=400)
    assert 260 < tokenizer.vocab_size <= 400  # 4 specials + 256 bytes + learned merges
    assert len(tokenizer.encode("the cat sees the house.")) <= 7  # whole words, not bytes
    assert tokenizer.encode("cat sees")[0] == tokenizer.encode("the cat sees")[1]  # first word = inner word


@pytest.mark.parametrize("kind", ["bpe", "char"])
@pytest.mark.parametrize("text", HARD_TEXTS)
def test_any_utf8_text_round_trips_exactly_without_unk(kind, text):
    tokenizer = Tokenizer.train(kind, _corpus(), vocab_size=400)
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.specials.unk not in ids
    assert tokenizer.specials.eos not in ids  # a typed "</s>" is text, not the end of the sentence


def test_saved_and_loaded_tokenizer_still_treats_special_strings_as_text(tmp_path):
    tokenizer = Tokenizer.train("bpe", _corpus(), vocab_size=400)
    tokenizer.save(tmp_path / "tokenizer.json")
    loaded = Tokenizer.load(tmp_path / "tokenizer.json")
    text = "stop </s> here"
    assert loaded.encode(text) == tokenizer.encode(text)
    assert loaded.decode(loaded.encode(text)) == text


def test_specials_are_found_by_role_wherever_they_are_in_the_vocabulary(tmp_path):
    layout = {"</s>": 0, "<unk>": 1, "cat": 2, "dog": 3, "<s>": 4, "<pad>": 5}  # Marian-like ids
    hf = HFTokenizer(models.WordLevel(vocab=layout, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.add_special_tokens(["</s>", "<unk>", "<s>", "<pad>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    tokenizer = Tokenizer.load(tmp_path / "tokenizer.json")
    assert tokenizer.specials == SpecialIds(pad=5, unk=1, bos=4, eos=0)
    assert tokenizer.decode([4, 2, 3, 5, 0, 2]) == "cat dog"  # start, tokens, pad, end, after the end


def test_a_vocabulary_without_a_pad_token_is_one_clear_error(tmp_path):
    hf = HFTokenizer(models.WordLevel(vocab={"<unk>": 0, "<s>": 1, "</s>": 2, "x": 3}, unk_token="<unk>"))
    hf.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(
        DataError, match=r"tokenizer\.json: the vocabulary has no <pad> or \[PAD\] or <\|endoftext\|> token"
    ):
        Tokenizer.load(tmp_path / "tokenizer.json")


@pytest.mark.parametrize("kind", ["char", "word"])
def test_char_and_word_tokenisers_round_trip(kind):
    texts = ["3 May 1987", "the cat sat", "12.01.2000"]
    tokenizer = Tokenizer.train(kind, texts)
    for text in texts:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.specials == SpecialIds(pad=0, unk=1, bos=2, eos=3)  # attnkit's own layout


def test_decode_stops_at_eos_and_saved_tokenizer_encodes_the_same(tmp_path):
    tokenizer = Tokenizer.train("char", ["abc"])
    ids, specials = tokenizer.encode("abc"), tokenizer.specials
    assert tokenizer.decode([specials.bos, *ids, specials.eos, *ids]) == "abc"
    tokenizer.save(tmp_path / "tokenizer.json")
    assert Tokenizer.load(tmp_path / "tokenizer.json").encode("cab") == tokenizer.encode("cab")
    (tmp_path / "bad.json").write_text("{}", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.json: not a tokenizer file"):
        Tokenizer.load(tmp_path / "bad.json")


def _lengths():
    pairs = dates(500, seed=3)
    return [len(s) for s in pairs.src], [len(t) for t in pairs.tgt]


def test_token_batches_cover_every_example_once_within_the_budget():
    src, tgt = _lengths()
    batches = token_batches(src, tgt, max_tokens=200, seed=1, epoch=0)
    assert Counter(i for b in batches for i in b) == Counter(range(len(src)))
    for b in batches:
        assert len(b) * max(max(src[i], tgt[i]) for i in b) <= 200


def test_token_batches_are_reproducible_per_seed_and_epoch_and_reshuffled_across_epochs():
    src, tgt = _lengths()

    def batches(seed, epoch):
        return [b.tolist() for b in token_batches(src, tgt, 200, seed=seed, epoch=epoch)]

    first = batches(seed=1, epoch=0)
    assert batches(seed=1, epoch=0) == first
    assert batches(seed=1, epoch=1) != first
    assert batches(seed=2, epoch=0) != first


def test_an_example_longer_than_the_budget_gets_its_own_batch():
    batches = token_batches([5, 50, 5], [5, 50, 5], 20, seed=0, epoch=0, shuffle=False)
    assert [b.tolist() for b in batches] == [[0, 2], [1]]


def test_make_batch_adds_specials_and_shifts_the_target():
    ids = SpecialIds(pad=5, unk=4, bos=1, eos=0)  # any layout: the ids come from the tokenizer
    batch = make_batch([[7, 8], [9]], [[10], [11, 12]], ids)
    assert batch.src.tolist() == [[7, 8, 0], [9, 0, 5]]
    assert batch.tgt_in.tolist() == [[1, 10, 5], [1, 11, 12]]
    assert batch.tgt_out.tolist() == [[10, 0, 5], [11, 12, 0]]
    assert batch.n_tokens == 5


def test_generated_dates_are_correct_and_held_out_sets_are_disjoint():
    import datetime as dt

    train = dates(300, seed=0)
    for iso in train.tgt:
        dt.date.fromisoformat(iso)
    held_out = dates(100, seed=1, exclude=set(train.src))
    assert not set(held_out.src) & set(train.src)


def test_a_tokenizer_file_that_pads_and_truncates_by_itself_gives_all_tokens_and_no_padding(tmp_path):
    tokenizer = Tokenizer.train("word", ["a b c d e f"])
    tokenizer.hf.enable_padding(length=16, pad_id=0, pad_token="<pad>")
    tokenizer.hf.enable_truncation(max_length=3)
    tokenizer.save(tmp_path / "tokenizer.json")
    loaded = Tokenizer.load(tmp_path / "tokenizer.json")
    assert loaded.decode(loaded.encode("a b c d e")) == "a b c d e"
    assert len(loaded.encode("a b c d e")) == 5


def _greedy(order, src, tgt, max_tokens):
    """The rule as stated: take the examples in order, each joining the current batch while
    ``count × longest`` still fits the budget, else starting the next one."""
    batches, current = [], []
    for i in order:
        longest = max([max(src[j], tgt[j]) for j in current] + [max(src[i], tgt[i])])
        if current and longest * (len(current) + 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    return [*batches, current]


@pytest.mark.parametrize("seed", range(6))
def test_token_batches_cut_the_length_sorted_examples_greedily(seed):
    r = random.Random(seed)
    n, budget = r.randrange(1, 300), r.randrange(1, 400)
    src = [r.randrange(1, 90) for _ in range(n)]
    tgt = [r.randrange(1, 90) for _ in range(n)]
    in_order = token_batches(src, tgt, budget, seed=0, epoch=0, shuffle=False)
    by_length = sorted(range(n), key=lambda i: (src[i], tgt[i]))
    assert [b.tolist() for b in in_order] == _greedy(by_length, src, tgt, budget)
    # shuffled: equal lengths in a random order, then the same greedy cut of that order
    batches = token_batches(src, tgt, budget, seed=seed, epoch=1)
    realised = [i for b in sorted(batches, key=lambda b: (src[b[0]], tgt[b[0]], b[0])) for i in b.tolist()]
    assert [(src[i], tgt[i]) for i in realised] == [(src[i], tgt[i]) for i in by_length]
    assert sorted(map(len, batches)) == sorted(map(len, _greedy(realised, src, tgt, budget)))


def test_token_batches_of_a_million_examples_take_numpy_arrays():
    lengths = np.random.default_rng(0).integers(1, 100, 1_000_000)
    batches = token_batches(lengths, lengths, 4096, seed=0, epoch=0)
    assert sum(map(len, batches)) == 1_000_000
    assert all(b.dtype == np.int64 for b in batches[:10])
