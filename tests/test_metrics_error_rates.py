"""Character and word error rates as speech recognition defines them, on strings small enough to count
by hand: the substitutions, deletions and insertions of the closest alignment, over all sentences,
divided by the references' characters or words."""

import pytest

pytest.importorskip("jiwer", reason="the error rates come from jiwer: pip install 'attnkit[speech]'")

from attnkit.metrics import error_rates


def test_error_rates_are_the_edits_over_the_reference_length():
    references = ["the third of may", "four hundred"]  # 16 + 12 characters, 4 + 2 words
    hypotheses = ["the first of may", "four hundred and"]
    # words: "third" -> "first" (one substitution), "and" inserted (one insertion)
    # characters: "third" -> "first" is four edits at the least (delete t: "hird", h -> f: "fird",
    # d -> s: "firs", insert t: "first"), and " and" is four insertions
    cer, wer = error_rates(hypotheses, references)
    assert wer == pytest.approx(2 / 6)
    assert cer == pytest.approx((4 + 4) / (16 + 12))
    assert error_rates(references, references) == (0.0, 0.0)
    with pytest.raises(ValueError, match="2 outputs but 1 references"):
        error_rates(hypotheses, references[:1])
