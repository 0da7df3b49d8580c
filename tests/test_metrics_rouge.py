"""ROUGE F1 as Lin (2004) defines it, on strings small enough to count by hand: n-gram overlap for
ROUGE-1/2, the longest common subsequence for ROUGE-L, Porter stemming, the mean over sentences, and
with several references the best one per measure."""

import pytest

pytest.importorskip("rouge_score", reason="ROUGE is computed with the rouge-score package")

from attnkit.metrics import rouge


def f1(overlap: int, hypothesis: int, reference: int) -> float:
    precision, recall = overlap / hypothesis, overlap / reference
    return 100 * 2 * precision * recall / (precision + recall)


def test_rouge_counts_ngrams_and_the_longest_common_subsequence():
    r1, r2, rl = rouge(["the cat sat"], [["the cat sat on the mat"]])
    assert r1.name == "ROUGE-1" and r1.score == pytest.approx(f1(3, 3, 6))  # the, cat, sat
    assert r2.score == pytest.approx(f1(2, 2, 5))  # "the cat", "cat sat" of 5 reference bigrams
    assert rl.score == pytest.approx(f1(3, 3, 6))  # LCS "the cat sat"
    _, _, rl_order = rouge(["mat the on sat"], [["the cat sat on the mat"]])
    assert rl_order.score == pytest.approx(f1(2, 4, 6))  # LCS of length 2 ("sat on" / "the mat" ...)


def test_rouge_stems_and_averages_over_sentences_and_takes_the_best_reference():
    r1, _, _ = rouge(["dogs running"], [["dog runs"]])
    assert r1.score == pytest.approx(100.0)  # Porter: dogs -> dog, running / runs -> run
    r1, r2, _ = rouge(["meeting moved", "send it"], [["meeting moved", "moved"], ["budget"]])
    assert r1.score == pytest.approx((100.0 + 0.0) / 2) and r2.score == pytest.approx(50.0)
    best, _, _ = rouge(["new meeting time"], [["budget review", "meeting time", "time"]])
    assert best.score == pytest.approx(f1(2, 3, 2))  # the second reference, the best of the three
