"""Extractive question answering (BERT §4.2): the answer is a span of the passage; the model gives each
passage token a start and an end logit, and the answer is the best valid span.

Data are generated (``data.task: qa``, see data/questions.py). The input is ``[CLS] question [SEP]
passage [SEP]`` with token type 0 for the question part and 1 for the passage. The answer's characters
are mapped to tokens through the tokenizer's offsets; an example whose answer falls beyond
``model.max_len`` tokens is dropped (and counted). The loss is BERT's: the mean of the cross-entropies
of the start and of the end position, summed over questions.

A prediction is the span ``(i, j)`` of passage tokens with ``i <= j < i + max_answer_tokens`` that
maximises ``start_i + end_j``, turned back into the passage's own characters. Validation reports the
loss, exact match and token F1 of the predicted answer text against the true one, normalised as the
SQuAD v1.1 evaluation script does (lower case, no punctuation or articles, single spaces).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.config import RunConfig
from attnkit.data.batching import EncoderBatch, encoder_input, length_batches, pad, token_batches
from attnkit.data.questions import QAExample, people_questions
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import AttnkitError
from attnkit.tasks.classification import ScoredAsAClassifier
from attnkit.tasks.validation import validation_loss

MAX_ANSWER_TOKENS = 30


@dataclass
class EncodedQuestion:
    ids: list[int]
    token_types: list[int]
    passage_start: int  # the first passage token's position in ``ids``
    offsets: list[tuple[int, int]]  # each passage token's characters in the passage
    span: tuple[int, int] | None  # the answer's first and last positions in ``ids``, when known


def encode_question(
    tokenizer: Tokenizer, question: str, passage: str, max_len: int, answer: tuple[int, int] | None = None
) -> EncodedQuestion | None:
    """The model input for a question and its passage (the passage cut to fit ``max_len``); with
    ``answer`` (its first and one-past-last characters), the answer's token positions, or None when the
    answer was cut off."""
    question_ids = tokenizer.encode(question)
    passage_ids, offsets = tokenizer.encode_with_offsets(passage)
    room = max(max_len - len(question_ids) - 3, 0)  # [CLS], [SEP], [SEP]
    passage_ids, offsets = passage_ids[:room], offsets[:room]
    ids, types = encoder_input(question_ids, tokenizer.specials, passage_ids)
    first = len(question_ids) + 2
    span = None
    if answer is not None:
        start, end = answer
        covering = [k for k, (a, b) in enumerate(offsets) if a < end and b > start]  # tokens in the answer
        if not covering:
            return None
        span = (first + covering[0], first + covering[-1])
    return EncodedQuestion(ids, types, first, offsets, span)


def question_batch(encoded: list[EncodedQuestion], pad_id: int) -> EncoderBatch:
    ids, types = pad([e.ids for e in encoded], pad_id), pad([e.token_types for e in encoded], 0)
    targets = ()
    if all(e.span is not None for e in encoded):
        targets = (torch.tensor([e.span[0] for e in encoded]), torch.tensor([e.span[1] for e in encoded]))
    return EncoderBatch(ids, types, targets, len(encoded))


def best_spans(start: Tensor, end: Tensor, passage: Tensor, max_tokens: int = MAX_ANSWER_TOKENS) -> Tensor:
    """The ``(i, j)`` of each row maximising ``start[i] + end[j]`` over passage positions with
    ``i <= j < i + max_tokens``: ``start, end, passage (B, T) -> (B, 2)``."""
    scores = start.unsqueeze(2) + end.unsqueeze(1)  # (B, T, T): [b, i, j] = start_i + end_j
    length = torch.arange(start.size(1), device=start.device)
    width = length.unsqueeze(0) - length.unsqueeze(1)  # (T, T): j - i
    valid = (width >= 0) & (width < max_tokens) & passage.unsqueeze(2) & passage.unsqueeze(1)
    flat = scores.masked_fill(~valid, float("-inf")).flatten(1).argmax(-1)  # (B,)
    return torch.stack([flat // start.size(1), flat % start.size(1)], dim=-1)


def _span_text(e: EncodedQuestion, passage: str, i: int, j: int) -> str:
    return passage[e.offsets[i - e.passage_start][0] : e.offsets[j - e.passage_start][1]].strip()


@torch.no_grad()
def answer(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    questions: list[str],
    passages: list[str],
    batch_size: int = 32,
    device: torch.device | str = "cpu",
) -> list[str]:
    """The best answer span of each passage to its question, as the passage's own text."""
    encoded = [
        encode_question(tokenizer, q, p, model.config.max_len)
        for q, p in zip(questions, passages, strict=True)
    ]
    answers = [""] * len(encoded)
    for group in length_batches(range(len(encoded)), [len(e.ids) for e in encoded], batch_size):
        batch = question_batch([encoded[k] for k in group], tokenizer.specials.pad).to(device)
        for k, (i, j) in zip(group, _predict(model, batch, [encoded[k] for k in group]), strict=True):
            answers[k] = _span_text(encoded[k], passages[k], i, j)
    return answers


def _predict(model: torch.nn.Module, batch: EncoderBatch, encoded: list[EncodedQuestion]) -> list[list[int]]:
    start, end = model(batch.ids, batch.token_types)
    return _spans(start, end, batch, encoded).tolist()


def _spans(start: Tensor, end: Tensor, batch: EncoderBatch, encoded: list[EncodedQuestion]) -> Tensor:
    """The best valid span of each row, within its passage: ``(B, 2)``."""
    positions = torch.arange(batch.ids.size(1), device=batch.ids.device)
    first = torch.tensor([e.passage_start for e in encoded], device=batch.ids.device).unsqueeze(1)
    last = torch.tensor([e.passage_start + len(e.offsets) for e in encoded], device=batch.ids.device)
    passage = (positions >= first) & (positions < last.unsqueeze(1))  # (B, T)
    return best_spans(start.float(), end.float(), passage)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's normalisation: lower case, punctuation and the articles a/an/the removed, spaces
    collapsed."""
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def exact_and_f1(predicted: str, gold: str) -> tuple[float, float]:
    """SQuAD's exact match and token F1 of one answer (after :func:`normalize_answer`)."""
    p, g = normalize_answer(predicted).split(), normalize_answer(gold).split()
    common = sum((Counter(p) & Counter(g)).values())
    if not p or not g:
        f1 = float(p == g)
    elif common == 0:
        f1 = 0.0
    else:
        precision, recall = common / len(p), common / len(g)
        f1 = 2 * precision * recall / (precision + recall)
    return float(p == g), f1


def encode_examples(tokenizer: Tokenizer, examples: list[QAExample], max_len: int):
    """Encoded examples whose answer fits in ``max_len`` tokens, and the examples they came from."""
    kept = []
    for x in examples:
        e = encode_question(
            tokenizer, x.question, x.context, max_len, (x.answer_start, x.answer_start + len(x.answer))
        )
        if e is not None:
            kept.append((e, x))
    return [e for e, _ in kept], [x for _, x in kept]


class SpanQATask(ScoredAsAClassifier):
    """The trainer's view of extractive QA: batches, loss and validation (see the module docstring)."""

    unit: ClassVar[str] = "questions"  # what the loss is summed over (the speed shown is questions/s)

    def __init__(self, config: RunConfig, tokenizer: Tokenizer | None, echo: Callable[[str], None]) -> None:
        d, t = config.data, config.train
        self.max_tokens, self.seed = t.max_tokens, t.seed
        train = people_questions(d.n_train, t.seed)
        valid = people_questions(d.n_valid, t.seed + 1, exclude={x.context for x in train})
        if tokenizer is None:
            texts = [x.question for x in train] + [x.context for x in train]
            tokenizer = Tokenizer.train(d.tokenizer, texts, d.vocab_size)
        self.tokenizer = tokenizer
        self.train, _ = encode_examples(tokenizer, train, config.model.max_len)
        self.valid, self.valid_examples = encode_examples(tokenizer, valid, config.model.max_len)
        dropped = len(train) + len(valid) - len(self.train) - len(self.valid)
        if dropped:
            echo(f"dropped {dropped} questions whose answer lies beyond model.max_len tokens")
        echo(
            f"training questions: {len(self.train):,}; validation: {len(self.valid):,}; "
            f"vocabulary: {tokenizer.vocab_size:,}"
        )

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        lengths = [len(e.ids) for e in self.train]
        return token_batches(lengths, lengths, self.max_tokens, seed=self.seed, epoch=epoch)

    def make_batch(self, indices: Sequence[int]) -> EncoderBatch:
        return question_batch([self.train[i] for i in indices], self.tokenizer.specials.pad)

    def loss(self, model: torch.nn.Module, batch: EncoderBatch) -> tuple[Tensor, Tensor]:
        """BERT's span loss, (CE(start) + CE(end)) / 2, summed over questions; padding is never a target."""
        return self._loss(*model(batch.ids, batch.token_types), batch)

    def _loss(self, start: Tensor, end: Tensor, batch: EncoderBatch) -> tuple[Tensor, Tensor]:
        padding = batch.ids == self.tokenizer.specials.pad
        start, end = start.float().masked_fill(padding, -1e4), end.float().masked_fill(padding, -1e4)
        loss = (
            F.cross_entropy(start, batch.targets[0], reduction="sum")
            + F.cross_entropy(end, batch.targets[1], reduction="sum")
        ) / 2
        return loss, loss.detach()

    def validate(self, model: torch.nn.Module, device: torch.device, autocast: Callable) -> dict[str, float]:
        """Loss, exact match and F1 of the best valid spans on the validation questions."""
        lengths = [len(e.ids) for e in self.valid]
        groups = token_batches(lengths, lengths, self.max_tokens, seed=0, epoch=0, shuffle=False)
        members = [[self.valid[i] for i in g] for g in groups]
        batches = [question_batch(encoded, self.tokenizer.specials.pad) for encoded in members]
        spans = []  # each batch's best spans, from the same forward pass as its loss
        encoded = iter(members)

        def loss_and_spans(model: torch.nn.Module, batch: EncoderBatch) -> tuple[Tensor, Tensor]:
            start, end = model(batch.ids, batch.token_types)
            spans.append(_spans(start, end, batch, next(encoded)))
            return self._loss(start, end, batch)

        scores = validation_loss(loss_and_spans, model, batches, device, autocast)
        exact = f1 = 0.0
        for k, (i, j) in zip((k for g in groups for k in g), torch.cat(spans).tolist(), strict=True):
            x = self.valid_examples[k]
            e, f = exact_and_f1(_span_text(self.valid[k], x.context, i, j), x.answer)
            exact, f1 = exact + e, f1 + f
        n = max(len(self.valid), 1)
        return {"valid_loss": scores["valid_loss"], "valid_exact": exact / n, "valid_f1": f1 / n}

    @classmethod
    def infer(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        config: RunConfig,
        inputs: Sequence[str],
        device: torch.device | str,
        where: str = "input",
        first: int = 1,
    ) -> list[str]:
        """Each ``question<TAB>passage`` input's answer, the passage's own text of the span the model
        finds most likely."""
        pairs = [line.split("\t", 1) for line in inputs]
        for number, pair in enumerate(pairs, start=first):
            if len(pair) != 2:
                raise AttnkitError(
                    f"{where}:{number}: no tab; a question-answering input is question<TAB>passage"
                )
        questions, passages = [q for q, _ in pairs], [p for _, p in pairs]
        return answer(model, tokenizer, questions, passages, config.decode.batch_size, device)
