"""The generated monolingual text: each word in its own slot, the same sentences for the same seed."""

from attnkit.data.synthetic import ANIMALS, PLACES, VERBS, slot_sentences


def test_slot_sentences_put_each_kind_of_word_in_its_place_and_repeat_with_their_seed():
    sentences = slot_sentences(500, seed=3)
    assert len(sentences) == 500 and sentences == slot_sentences(500, seed=3) != slot_sentences(500, seed=4)
    for sentence in sentences:
        the, animal, verb, on, the_, place = sentence.split(" ")
        assert (the, on, the_) == ("the", "on", "the")
        assert animal in ANIMALS and verb in VERBS and place in PLACES
    used = {word for sentence in sentences for word in sentence.split(" ")}
    assert set(ANIMALS) | set(VERBS) | set(PLACES) <= used  # 500 draws use every word
