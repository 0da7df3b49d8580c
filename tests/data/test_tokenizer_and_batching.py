"""Tokenisers round-trip text with fixed special ids; token batches are complete, bounded, repeatable."""

from collections import Counter
from pathlib import Path

import pytest

from attnkit.data.batching import make_batch, token_batches
from attnkit.data.readers import read_parallel
from attnkit.data.synthetic import dates
from attnkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from attnkit.errors import DataError

MULTI30K = Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"


def test_joint_bpe_round_trips_real_german_and_english():
    if not MULTI30K.is_dir():
        pytest.skip(f"real data not found at {MULTI30K} (../shared/data is absent)")
    pairs = read_parallel(MULTI30K / "val.de.gz", MULTI30K / "val.en.gz")
    tokenizer = Tokenizer.train("bpe", pairs.src + pairs.tgt, vocab_size=3000)
    assert 2000 < tokenizer.vocab_size <= 3000
    for text in pairs.src[:50] + pairs.tgt[:50]:
        assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.parametrize("kind", ["char", "word"])
def test_char_and_word_tokenisers_round_trip(kind):
    texts = ["3 May 1987", "the cat sat", "12.01.2000"]
    tokenizer = Tokenizer.train(kind, texts)
    for text in texts:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert [tokenizer.hf.id_to_token(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]


def test_decode_stops_at_eos_and_saved_tokenizer_encodes_the_same(tmp_path):
    tokenizer = Tokenizer.train("char", ["abc"])
    ids = tokenizer.encode("abc")
    assert tokenizer.decode([BOS_ID, *ids, EOS_ID, *ids]) == "abc"
    tokenizer.save(tmp_path / "tokenizer.json")
    assert Tokenizer.load(tmp_path / "tokenizer.json").encode("cab") == tokenizer.encode("cab")
    (tmp_path / "bad.json").write_text("{}")
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
    first = token_batches(src, tgt, 200, seed=1, epoch=0)
    assert token_batches(src, tgt, 200, seed=1, epoch=0) == first
    assert token_batches(src, tgt, 200, seed=1, epoch=1) != first
    assert token_batches(src, tgt, 200, seed=2, epoch=0) != first


def test_an_example_longer_than_the_budget_gets_its_own_batch():
    assert token_batches([5, 50, 5], [5, 50, 5], 20, seed=0, epoch=0, shuffle=False) == [[0, 2], [1]]


def test_make_batch_adds_specials_and_shifts_the_target():
    batch = make_batch([[7, 8], [9]], [[10], [11, 12]])
    assert batch.src.tolist() == [[7, 8, EOS_ID], [9, EOS_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 10, PAD_ID], [BOS_ID, 11, 12]]
    assert batch.tgt_out.tolist() == [[10, EOS_ID, PAD_ID], [11, 12, EOS_ID]]
    assert batch.n_tokens == 5


def test_generated_dates_are_correct_and_held_out_sets_are_disjoint():
    import datetime as dt

    train = dates(300, seed=0)
    for iso in train.tgt:
        dt.date.fromisoformat(iso)
    held_out = dates(100, seed=1, exclude=set(train.src))
    assert not set(held_out.src) & set(train.src)
