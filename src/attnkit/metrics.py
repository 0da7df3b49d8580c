"""Evaluation metrics: BLEU and chrF through sacreBLEU (with their signatures), perplexity, accuracy."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF


@dataclass
class Score:
    name: str
    score: float
    signature: str

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f}  ({self.signature})"


def bleu(hypotheses: list[str], references: list[str]) -> Score:
    """Corpus BLEU on detokenised text with sacreBLEU's default 13a tokenisation (Post, 2018)."""
    metric = BLEU()
    return Score("BLEU", metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature()))


def chrf(hypotheses: list[str], references: list[str]) -> Score:
    """Character n-gram F-score (Popović, 2015) via sacreBLEU."""
    metric = CHRF()
    return Score("chrF", metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature()))


def perplexity(loss_per_token: float) -> float:
    """``exp`` of the mean negative log-likelihood per token (capped to stay finite)."""
    return math.exp(min(loss_per_token, 100.0))


def exact_match(hypotheses: list[str], references: list[str]) -> float:
    """Fraction of hypotheses equal to their reference."""
    return sum(h == r for h, r in zip(hypotheses, references, strict=True)) / max(len(references), 1)
