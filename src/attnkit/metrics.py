"""Evaluation metrics: BLEU and chrF through sacreBLEU (with their signatures), ROUGE through rouge-score,
character and word error rates through jiwer, perplexity, accuracy."""

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


ROUGE_TYPES = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L"}


def rouge(hypotheses: list[str], references: list[list[str]]) -> list[Score]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F1 (Lin, 2004) × 100, the mean over sentences, through Google's
    ``rouge-score`` with Porter stemming, as the summarisation literature reports them. With several
    references a sentence counts its best one for each measure (``score_multi``; the convention of the
    AESLC paper, Zhang & Tetreault 2019)."""
    try:
        from rouge_score.rouge_scorer import RougeScorer
    except ImportError:
        raise ImportError("ROUGE needs rouge-score: pip install 'attnkit[summarise]'") from None
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} outputs but {len(references)} references")
    scorer = RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for hypothesis, refs in zip(hypotheses, references, strict=True):
        scores = scorer.score_multi(refs, hypothesis)
        for kind in ROUGE_TYPES:
            totals[kind] += scores[kind].fmeasure
    n = max(len(hypotheses), 1)
    signature = "rouge-score, F1, Porter stemmer, best of the references"
    return [Score(name, 100 * totals[kind] / n, signature) for kind, name in ROUGE_TYPES.items()]


def error_rates(hypotheses: list[str], references: list[str]) -> tuple[float, float]:
    """Character and word error rates (CER, WER) of ``hypotheses`` against ``references``: the edits
    (substitutions, deletions, insertions) of the closest alignment over all sentences, divided by the
    references' characters or words, as speech recognition reports them (jiwer's ``cer`` and ``wer``)."""
    try:
        import jiwer
    except ImportError:
        raise ImportError("error rates need jiwer: pip install 'attnkit[speech]'") from None
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} outputs but {len(references)} references")
    return float(jiwer.cer(references, hypotheses)), float(jiwer.wer(references, hypotheses))
