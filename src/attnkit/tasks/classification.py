"""Sequence classification (e.g. sentiment): a sentence -> one of a few labels, with an encoder model
(BERT §4.1: the pooled ``[CLS]`` state, or the mean of the token states, and a linear layer).

Data are TSV files of ``sentence<TAB>label`` (``data.task: classify``; GLUE's SST-2 layout, an optional
header line). The training file is prepared once into a token store (:func:`prepared_sentences`). The
labels are ``data.labels`` or, when that is empty, the sorted labels of the training file; they are
stored in the run's config, so that predictions name them. Each sentence becomes
``[CLS] sentence [SEP]``, cut to ``model.max_len`` tokens (how many were cut is reported). A batch holds
sentences of similar length within ``train.max_tokens``; the loss is the cross-entropy of the label
(label-smoothed with ``train.label_smoothing``), summed over sentences and divided by their number.
Validation reports the loss, the accuracy and the macro-averaged F1 (the mean over labels of each
label's F1, so that a rare label counts as much as a common one).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.config import RunConfig
from attnkit.data.batching import EncoderBatch, encoder_input, length_batches, pad, token_batches
from attnkit.data.readers import LabelledText, iter_labelled, iter_sentences, read_labelled
from attnkit.data.store import TokenStore, in_blocks, prepared, store_root, uniform_sample
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import AttnkitError, DataError
from attnkit.tasks.protocol import Given, Scoring
from attnkit.tasks.validation import validation_loss


def _whole_rows(tokenizer: Tokenizer, sentences: list[str]) -> list[list[int]]:
    """``[CLS] sentence [SEP]`` ids for each sentence, however long."""
    return [encoder_input(ids, tokenizer.specials)[0] for ids in tokenizer.encode_batch(sentences)]


def cut_row(row: list[int], max_len: int) -> list[int]:
    """``row`` cut to ``max_len`` ids, keeping its final ``[SEP]``."""
    return row if len(row) <= max_len else [*row[: max_len - 1], row[-1]]


def encode_sentences(tokenizer: Tokenizer, sentences: list[str], max_len: int) -> tuple[list[list[int]], int]:
    """``[CLS] sentence [SEP]`` ids for each sentence, cut to ``max_len``; and how many were cut."""
    rows = _whole_rows(tokenizer, sentences)
    return [cut_row(row, max_len) for row in rows], sum(len(row) > max_len for row in rows)


def prepared_sentences(
    config: RunConfig, tokenizer: Tokenizer | None, echo: Callable[[str], None], *, labelled: bool
) -> TokenStore:
    """The training sentences as a token store (data/store.py): column ``sentence`` (each
    ``[CLS] sentence [SEP]``, cut to ``model.max_len``) and, ``labelled`` (a classifier), column
    ``label`` (each row one index into the report's ``labels``, the file's labels sorted; the task maps
    them to ``data.labels``, so that the store does not depend on that setting). Built the first time
    by streaming the file (one pass to count the sentences and find the labels, one for the
    tokenizer's sample of up to ``data.tokenizer_sample`` of them, one to encode), found afterwards
    without reading it.

    The report holds ``labels``, ``train_rows`` and ``cut`` (sentences cut to ``model.max_len``:
    [training, held out]). Masked-LM data without a validation file hold out their last
    ``data.valid_fraction`` of the sentences: the rows after ``train_rows``, which the tokenizer does
    not learn from."""
    d = config.data
    path, max_len = d.path(d.train[0]), config.model.max_len
    held_out = not labelled and not d.valid
    settings = {"task": d.task, "tokenizer": d.tokenizer, "vocab_size": d.vocab_size, "max_len": max_len,
                "valid_fraction": d.valid_fraction if held_out else None}  # fmt: skip

    def lines() -> Iterator[tuple[str, str | None, int]]:  # (sentence, label, line number), streamed
        if labelled:
            return iter_labelled(path)
        return ((sentence, None, number) for sentence, number in iter_sentences(path))

    def build(given: Tokenizer | None):
        rows, seen = 0, set()
        for _, label, _ in lines():
            rows += 1
            seen.add(label)
        labels = sorted(seen) if labelled else []
        train_rows = int(rows * (1 - d.valid_fraction)) if held_out else rows
        if held_out and train_rows in (0, rows):
            raise DataError(f"{path}: too few sentences to hold out data.valid_fraction")
        sample = uniform_sample((s for s, _, _ in itertools.islice(lines(), train_rows)), d.tokenizer_sample)
        made_with = given or Tokenizer.train(d.tokenizer, sample, d.vocab_size, mask=not labelled)
        report = {"labels": list(labels), "train_rows": train_rows, "cut": [0, 0]}
        index = {label: i for i, label in enumerate(labels)}

        def encoded() -> Iterator[tuple[list[int], ...]]:
            done = 0
            for block in in_blocks(lines(), 8192):
                rows = _whole_rows(made_with, [sentence for sentence, _, _ in block])
                for (_, label, _), row in zip(block, rows, strict=True):
                    report["cut"][done >= train_rows] += len(row) > max_len
                    done += 1
                    yield (cut_row(row, max_len), [index[label]]) if labelled else (cut_row(row, max_len),)

        return made_with, ("sentence", "label") if labelled else ("sentence",), encoded(), report

    return prepared(store_root(d.store), [path], settings, tokenizer, build, echo)


def sentence_batch(rows: list[list[int]], pad_id: int, labels: list[int] | None = None) -> EncoderBatch:
    ids = pad(rows, pad_id)
    targets = (torch.tensor(labels),) if labels is not None else ()
    return EncoderBatch(ids, torch.zeros_like(ids), targets, len(rows))


def label_ids(data: LabelledText, labels: list[str], path: object) -> list[int]:
    """Each line's label as an index into ``labels``; an unknown label is an error naming the line."""
    index = {label: i for i, label in enumerate(labels)}
    for label, line in zip(data.labels, data.lines, strict=True):
        if label not in index:
            raise DataError(f"{path}:{line}: label {label!r} is not one of the labels {labels}")
    return [index[label] for label in data.labels]


@torch.no_grad()
def classify(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    sentences: list[str],
    batch_size: int = 64,
    device: torch.device | str = "cpu",
) -> Tensor:
    """Class probabilities ``(N, num_labels)`` for ``sentences`` (cut to the model's length)."""
    rows, _ = encode_sentences(tokenizer, sentences, model.config.max_len)
    probabilities = torch.empty(len(rows), model.config.num_labels)
    for group in length_batches(range(len(rows)), [len(r) for r in rows], batch_size):
        ids = sentence_batch([rows[i] for i in group], tokenizer.specials.pad).ids.to(device)
        probabilities[group] = model(ids).float().softmax(-1).cpu()
    return probabilities


def accuracy_and_f1(predicted: list[int], gold: list[int], n_labels: int) -> tuple[float, float]:
    """Accuracy and macro-F1: per label, F1 = 2·TP / (2·TP + FP + FN) (0 for a label never predicted
    nor present), averaged over the labels."""
    correct = sum(p == g for p, g in zip(predicted, gold, strict=True))
    f1 = []
    for label in range(n_labels):
        tp = sum(p == label and g == label for p, g in zip(predicted, gold, strict=True))
        fp = sum(p == label and g != label for p, g in zip(predicted, gold, strict=True))
        fn = sum(p != label and g == label for p, g in zip(predicted, gold, strict=True))
        f1.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return correct / max(len(gold), 1), sum(f1) / n_labels


def score_classifier(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    labels: list[str],
    data: LabelledText,
    path: object,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
) -> tuple[float, float, int]:
    """Accuracy, macro-F1 and the number right of a classifier with ``labels`` on labelled sentences
    read from ``path`` (named by the error for a label the classifier does not know)."""
    gold = label_ids(data, labels, path)
    predicted = classify(model, tokenizer, data.sentences, batch_size, device).argmax(-1).tolist()
    accuracy, f1 = accuracy_and_f1(predicted, gold, len(labels))
    return accuracy, f1, sum(p == g for p, g in zip(predicted, gold, strict=True))


# An encoder is scored as a classifier, on labelled sentences; another head is refused in one line.
ENCODER_SCORING = Scoring(files=("data",), asks="evaluate it with --data FILE.tsv", heads=("classify",))


class ScoredAsAClassifier:
    """What ``attnkit evaluate`` does with an encoder trained on another task than classification
    (masked-LM, question answering): it asks for labelled sentences, as of any encoder, and then refuses
    the model's head in one line (``scoring.heads``), before its ``score`` would be called."""

    scoring: ClassVar[Scoring] = ENCODER_SCORING

    @classmethod
    def score(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        config: RunConfig,
        given: Given,
        device: torch.device | str,
    ) -> list[str]:
        """Refused: attnkit evaluate scores an encoder's classifier head only."""
        raise AttnkitError(
            f"attnkit evaluate scores a classifier, not a model with a {config.model.head} head"
        )


class ClassificationTask:
    """The trainer's view of classification: batches, loss and validation (see the module docstring)."""

    unit: ClassVar[str] = "sentences"  # what the loss is summed over (the speed shown is sentences/s)
    scoring: ClassVar[Scoring] = ENCODER_SCORING

    def __init__(self, config: RunConfig, tokenizer: Tokenizer | None, echo: Callable[[str], None]) -> None:
        d = config.data
        self.label_smoothing, self.max_tokens = config.train.label_smoothing, config.train.max_tokens
        self.seed = config.train.seed
        train_path, valid_path = d.path(d.train[0]), d.path(d.valid[0])
        valid = read_labelled(valid_path)  # small: read whole; the training file through its store
        store = prepared_sentences(config, tokenizer, echo, labelled=True)
        labels = d.labels or store.report["labels"]
        if len(labels) < 2:
            raise DataError(f"{train_path}: one label only ({labels[0]!r}); a classifier needs two or more")
        unknown = [label for label in store.report["labels"] if label not in labels]
        if unknown:
            raise DataError(f"{train_path}: label {unknown[0]!r} is not one of data.labels {labels}")
        # The labels decide the classifier's size and are named by predictions: stored with the run.
        d.labels, config.model.num_labels = list(labels), len(labels)
        self.to_label = np.array([labels.index(label) for label in store.report["labels"]])  # store -> ours
        self.train_labels = store.columns["label"].ids  # one per sentence, in the store's numbering
        self.valid_labels = label_ids(valid, labels, valid_path)
        self.tokenizer, self.n_labels = store.tokenizer, len(labels)
        self.rows, cut = store.columns["sentence"], store.report["cut"][0]
        self.valid_rows, valid_cut = encode_sentences(self.tokenizer, valid.sentences, config.model.max_len)
        if cut or valid_cut:
            echo(f"cut {cut} training and {valid_cut} validation sentences to model.max_len tokens")
        echo(
            f"training sentences: {len(self.rows):,}; validation: {len(self.valid_rows):,}; labels: "
            f"{', '.join(labels)}; vocabulary: {self.tokenizer.vocab_size:,}"
        )

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """This epoch's batches of sentence indices, the same for the same (seed, epoch)."""
        lengths = self.rows.lengths()
        return token_batches(lengths, lengths, self.max_tokens, seed=self.seed, epoch=epoch)

    def make_batch(self, indices: Sequence[int]) -> EncoderBatch:
        labels = self.to_label[self.train_labels[np.asarray(indices)]].tolist()
        return sentence_batch([self.rows[i] for i in indices], self.tokenizer.specials.pad, labels)

    def loss(self, model: torch.nn.Module, batch: EncoderBatch) -> tuple[Tensor, Tensor]:
        """Summed (label-smoothed) cross-entropy and NLL of the labels."""
        return self._loss(model(batch.ids, batch.token_types).float(), batch)

    def _loss(self, logits: Tensor, batch: EncoderBatch) -> tuple[Tensor, Tensor]:
        (labels,) = batch.targets
        loss = F.cross_entropy(logits, labels, reduction="sum", label_smoothing=self.label_smoothing)
        return loss, F.cross_entropy(logits.detach(), labels, reduction="sum")

    def validate(self, model: torch.nn.Module, device: torch.device, autocast: Callable) -> dict[str, float]:
        """Loss, accuracy and macro-F1 on the validation sentences."""
        lengths = [len(row) for row in self.valid_rows]
        groups = token_batches(lengths, lengths, self.max_tokens, seed=0, epoch=0, shuffle=False)
        pad_id = self.tokenizer.specials.pad
        batches = [
            sentence_batch([self.valid_rows[i] for i in g], pad_id, [self.valid_labels[i] for i in g])
            for g in groups
        ]
        predicted = []  # each batch's predicted labels, from the same forward pass as its loss

        def loss_and_labels(model: torch.nn.Module, batch: EncoderBatch) -> tuple[Tensor, Tensor]:
            logits = model(batch.ids, batch.token_types).float()
            predicted.append(logits.argmax(-1))
            return self._loss(logits, batch)

        scores = validation_loss(loss_and_labels, model, batches, device, autocast)
        gold = [self.valid_labels[i] for group in groups for i in group]  # in batch order, as predicted
        accuracy, f1 = accuracy_and_f1(torch.cat(predicted).tolist(), gold, self.n_labels)
        return {"valid_loss": scores["valid_loss"], "valid_accuracy": accuracy, "valid_f1": f1}

    @classmethod
    def prepare_store(cls, config: RunConfig, echo: Callable[[str], None]) -> None:
        """``attnkit prepare``: the labelled training sentences in a token store
        (:func:`prepared_sentences`)."""
        prepared_sentences(config, None, echo, labelled=True)

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
        """Each sentence's most probable label and its probability, ``label<TAB>probability``."""
        probabilities = classify(model, tokenizer, list(inputs), config.decode.batch_size, device)
        best, label = probabilities.max(-1)
        labels = config.data.labels
        return [f"{labels[i]}\t{p:.4f}" for p, i in zip(best.tolist(), label.tolist(), strict=True)]

    @classmethod
    def score(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        config: RunConfig,
        given: Given,
        device: torch.device | str,
    ) -> list[str]:
        """Accuracy and macro-F1 on the labelled sentences of ``given.data``."""
        labelled = read_labelled(given.data)
        began = time.perf_counter()
        accuracy, f1, correct = score_classifier(
            model, tokenizer, config.data.labels, labelled, given.data, config.decode.batch_size, device
        )
        seconds = time.perf_counter() - began
        return [
            f"accuracy {accuracy:.4f} ({correct}/{len(labelled)}), macro-F1 {f1:.4f}",
            f"{len(labelled)} sentences of {given.data} in {seconds:.1f} s",
        ]
