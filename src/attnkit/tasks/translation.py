"""Translation: source sentence -> target sentence with an encoder-decoder (the paper's task); and
summarisation, the same with long sources and short targets.

Data are parallel text files (``data.task: parallel``) or a task generated in code (``dates``, ``copy``);
for ``summarise``, JSON Lines files (``data.fields``: the source and target fields), whose sources are
cut to ``data.max_source_len`` tokens (counted and reported) instead of being dropped.
A batch is sentence pairs of similar length within a token budget (data/batching.py); the loss is the
label-smoothed cross-entropy of the target given the source and the target's previous tokens;
validation reports loss, perplexity, and BLEU and exact-match accuracy of greedy translations (for
summaries: ROUGE-1/2/L F1 against every reference, the best one counting).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from attnkit.config import DataConfig, DecodeConfig, RunConfig
from attnkit.data.batching import Batch, make_batch, token_batches
from attnkit.data.readers import ParallelText, Records, iter_jsonl, iter_pairs, read_jsonl, read_parallel
from attnkit.data.store import StoreColumn, prepared, store_root, uniform_sample
from attnkit.data.synthetic import generate
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.starts import cut_sources
from attnkit.decode.translate import Reporting, translate
from attnkit.errors import ConfigError, DataError
from attnkit.metrics import bleu, chrf, exact_match, rouge
from attnkit.models import unwrap
from attnkit.task_records import task_record
from attnkit.tasks.losses import generative_loss
from attnkit.tasks.protocol import Given, Scoring
from attnkit.tasks.validation import validation_loss

SUMMARY_TASK = "summarise"  # the data.task SummarisationTask does (its record in attnkit/task_records.py)


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    train_src: Sequence[list[int]]  # lists, or a prepared store's columns (data/store.py)
    train_tgt: Sequence[list[int]]
    valid: ParallelText

    def train_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Each training pair's source and target length, as batched (with ``</s>``, ``<s>``/``</s>``),
        ``(pairs,)`` each: from a store's offsets without reading a token."""
        if isinstance(self.train_src, StoreColumn) and isinstance(self.train_tgt, StoreColumn):
            return _plus_one(self.train_src.lengths()), _plus_one(self.train_tgt.lengths())
        return (
            _plus_one(np.fromiter(map(len, self.train_src), np.int32, len(self.train_src))),
            _plus_one(np.fromiter(map(len, self.train_tgt), np.int32, len(self.train_tgt))),
        )


def while_training(config: RunConfig) -> DecodeConfig:
    """The run's decoding settings for validation during training, with the model's own steps: its
    weights change between validations, so compiled ones (decode.steps) would never be used twice; and
    without drafts (decode.speculative): a draft decoder is distilled from the trained model, and drafts
    change no output."""
    return dataclasses.replace(config.decode, steps="eager", speculative="none")


def _plus_one(lengths: np.ndarray) -> np.ndarray:
    """Lengths with one special token more, as int32 (4 bytes a pair: 18 MB for 4.5M pairs)."""
    lengths = lengths.astype(np.int32)
    lengths += 1
    return lengths


def read_split(config: DataConfig, split: str, seed: int, drop_empty: bool = True) -> ParallelText:
    """The ``train``/``valid``/``test`` split: generated for synthetic tasks, read from files otherwise
    (``drop_empty`` as in :func:`read_parallel`)."""
    if config.task == SUMMARY_TASK:
        return _read_summaries(config, split)
    if config.task != "parallel":
        train = generate(config.task, config.n_train, seed)
        if split == "train":
            return train
        offset = {"valid": 1, "test": 2}[split]
        return generate(config.task, config.n_valid, seed + offset, exclude=set(train.src))
    files = getattr(config, split)
    if len(files) != 2:
        raise ConfigError(f"data.{split} is not set: it must list two files [source, target]")
    return read_parallel(config.path(files[0]), config.path(files[1]), drop_empty)


def read_summaries(config: DataConfig, path: Path, with_references: bool = True) -> Records:
    """A JSON Lines file of ``data.fields``, read once: the sources and the target field's references,
    and ``with_references`` those of ``data.references`` too where it names another field."""
    source, target = config.fields
    extra = config.references not in ("", target) and with_references
    return read_jsonl(path, source, target, *([config.references] if extra else []))


def _read_summaries(config: DataConfig, split: str) -> ParallelText:
    """A JSON Lines split: sources and their first reference as the target (for the loss), and for
    validation and test every reference in ``data.references`` (or the target field)."""
    files = getattr(config, split)
    if len(files) != 1:
        raise ConfigError(f"data.{split} is not set: it must list one JSON Lines file")
    records = read_summaries(config, config.path(files[0]), with_references=split != "train")
    targets = records.references[config.fields[1]]
    references = records.references.get(config.references, targets)
    return ParallelText(records.src, [r[0] for r in targets], references=references)


def prepare_data(
    config: DataConfig, seed: int, tokenizer: Tokenizer | None = None, echo: Callable[[str], None] = print
) -> PreparedData:
    """Read (or generate), learn the tokeniser if none is given, encode, and drop over-long pairs.
    Parallel files are prepared once into a token store (data/store.py) that later runs find again."""
    valid = read_split(config, "valid", seed)
    if valid.dropped_empty:
        echo(f"dropped {valid.dropped_empty} validation pairs with an empty side")
    if task_record(config.task).files:  # read from files: kept in a token store
        return _from_store(config, valid, tokenizer, echo)
    train = read_split(config, "train", seed)
    tokenizer, src, tgt, report = _encoded_training_pairs(config, train, tokenizer)
    _say_report(report, echo)
    echo(f"training pairs: {len(src):,}; validation: {len(valid):,}; vocabulary: {tokenizer.vocab_size:,}")
    return PreparedData(tokenizer, src, tgt, valid)


def _from_store(
    config: DataConfig, valid: ParallelText, tokenizer: Tokenizer | None, echo: Callable[[str], None]
) -> PreparedData:
    """Training files (parallel text, or JSON Lines of summaries) through their token store: built (and
    the tokenizer learned) the first time, found afterwards without reading the training text."""
    files = [config.path(name) for name in config.train]
    wanted = "one JSON Lines file" if config.task == SUMMARY_TASK else "two files [source, target]"
    if not files:  # (a list of the wrong length is refused with the config)
        raise ConfigError(f"data.train is not set: it must list {wanted}")
    for path in files:
        if not path.is_file():
            raise DataError(f"{path}: file not found")
    settings = {"task": config.task, "tokenizer": config.tokenizer, "vocab_size": config.vocab_size,
                "max_len": config.max_len}  # fmt: skip
    if config.task == SUMMARY_TASK:
        settings.update(fields=config.fields, source_limit=config.source_limit)

    def build(given: Tokenizer | None):
        report = {"dropped_empty": 0, "dropped_long": 0, "max_len": config.max_len}
        made_with = given or Tokenizer.train(
            config.tokenizer,
            _sample(_training_texts(config, files, {}), config.tokenizer_sample),
            config.vocab_size,
        )
        rows = _encoded_pairs(_training_texts(config, files, report), made_with, config, report)
        return made_with, ("src", "tgt"), rows, report

    store = prepared(store_root(config.store), files, settings, tokenizer, build, echo)
    _say_report(store.report, echo)
    tokenizer = store.tokenizer
    echo(f"training pairs: {len(store):,}; validation: {len(valid):,}; vocabulary: {tokenizer.vocab_size:,}")
    return PreparedData(tokenizer, store.columns["src"], store.columns["tgt"], valid)


def _training_texts(config: DataConfig, files: list[Path], report: dict) -> Iterator[tuple[str, str]]:
    """The training pairs' texts, streamed: aligned lines of parallel files (pairs with an empty side
    counted in ``report`` and dropped), or each JSON Lines record's source and first target."""
    if config.task != SUMMARY_TASK:
        return iter_pairs(*files, report)
    source, target = config.fields
    return ((text, references[target][0]) for text, references in iter_jsonl(files[0], source, target))


def _sample(pairs: Iterable[tuple[str, str]], size: int) -> list[str]:
    """The texts of up to ``size`` training pairs (:func:`uniform_sample`), sources then targets, for
    learning the tokenizer."""
    kept = uniform_sample(pairs, size)
    return [s for s, _ in kept] + [t for _, t in kept]


def _encoded_pairs(
    pairs: Iterable[tuple[str, str]], tokenizer: Tokenizer, config: DataConfig, report: dict
) -> Iterator[tuple]:
    """The kept training pairs' ids (:func:`_short_enough`), encoded a block at a time as the files are
    read; a summary's source cut to ``data.max_source_len`` tokens first (counted in ``report``)."""
    summaries = config.task == SUMMARY_TASK
    if summaries:
        report.update(cut=0, pairs=0, source_limit=config.source_limit)

    def encoded() -> Iterator[tuple[list[int], list[int]]]:
        iterator = iter(pairs)
        while block := list(itertools.islice(iterator, 20_000)):
            src = tokenizer.encode_batch([s for s, _ in block])
            if summaries:  # a long email is still worth its first tokens
                src, cut = cut_sources(src, config.source_limit)
                report["cut"] += cut
                report["pairs"] += len(src)
            yield from zip(src, tokenizer.encode_batch([t for _, t in block]), strict=True)

    return _short_enough(encoded(), config.max_len, report)


def _short_enough(
    pairs: Iterable[tuple[list[int], list[int]]], max_len: int, report: dict
) -> Iterator[tuple]:
    """The encoded pairs both of whose sides fit ``max_len`` with their specials (``</s>``, or
    ``<s>``/``</s>``), dropped together to keep alignment and counted in ``report["dropped_long"]``;
    none kept is an error."""
    kept = 0
    for s, t in pairs:
        if len(s) + 1 <= max_len and len(t) + 1 <= max_len:
            kept += 1
            yield s, t
        else:
            report["dropped_long"] = report.get("dropped_long", 0) + 1
    if not kept:
        raise ConfigError(f"data.max_len={max_len} leaves no training pair")


def _say_report(report: dict, echo: Callable[[str], None]) -> None:
    """What preparing the training pairs dropped or cut (the same whether just built or found)."""
    if report.get("dropped_empty"):
        echo(f"dropped {report['dropped_empty']} training pairs with an empty side")
    if report.get("cut"):
        echo(
            f"cut {report['cut']:,} of {report['pairs']:,} training sources to data.max_source_len="
            f"{report['source_limit']} tokens"
        )
    if report.get("dropped_long"):
        echo(
            f"dropped {report['dropped_long']} training pairs longer than data.max_len="
            f"{report['max_len']} tokens"
        )


def _encoded_training_pairs(
    config: DataConfig, train: ParallelText, tokenizer: Tokenizer | None
) -> tuple[Tokenizer, list[list[int]], list[list[int]], dict]:
    """A generated task's tokenizer (learned if none is given), its kept training pairs' ids, and a
    report of what was dropped."""
    report = {"dropped_empty": train.dropped_empty, "max_len": config.max_len}
    if tokenizer is None:
        tokenizer = Tokenizer.train(config.tokenizer, train.src + train.tgt, config.vocab_size)
    src, tgt = tokenizer.encode_batch(train.src), tokenizer.encode_batch(train.tgt)
    kept = list(_short_enough(zip(src, tgt, strict=True), config.max_len, report))
    return tokenizer, [s for s, _ in kept], [t for _, t in kept], report


class TranslationTask:
    """Translation: batches, loss, validation by greedy translations' scores (see the module docstring),
    and inference: translating."""

    unit: ClassVar[str] = "target tokens"  # what the loss is summed over (the speed shown is target tokens/s)
    cuts_sources: ClassVar[bool] = False  # sources cut to data.max_source_len, in training and inference
    scoring: ClassVar[Scoring] = Scoring(
        files=("src", "ref"), asks="evaluate it with --src FILE --ref FILE", decodes=True
    )

    def __init__(
        self,
        config: RunConfig,
        tokenizer: Tokenizer | None,
        echo: Callable[[str], None],
    ) -> None:
        self.config = config
        self.data = prepare_data(config.data, config.train.seed, tokenizer, echo)
        self.tokenizer = self.data.tokenizer
        self.lengths = self.data.train_lengths()
        self.valid_ids = self.validation_ids(self.data.valid)

    def validation_ids(self, valid: ParallelText) -> tuple[list[list[int]], list[list[int]]]:
        """The validation sources' and targets' token ids."""
        return self.tokenizer.encode_batch(valid.src), self.tokenizer.encode_batch(valid.tgt)

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """This epoch's batches of pair indices, the same for the same (seed, epoch)."""
        t = self.config.train
        return token_batches(*self.lengths, t.max_tokens, seed=t.seed, epoch=epoch)

    def make_batch(self, indices: Sequence[int]) -> Batch:
        data = self.data
        return make_batch([data.train_src[i] for i in indices], [data.train_tgt[i] for i in indices],
                          self.tokenizer.specials)  # fmt: skip

    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
        """Summed label-smoothed loss and NLL over the batch's target tokens (plus, for a model that
        samples its attention, the REINFORCE term that trains the sampling)."""
        loss, nll = generative_loss(
            model, (batch.src, batch.tgt_in), batch.tgt_out, self.config.train.label_smoothing,
            self.tokenizer.specials.pad,
        )  # fmt: skip
        policy_loss = getattr(unwrap(model), "policy_loss", None)
        if policy_loss is not None:  # rewarded with each token's log-likelihood
            loss = loss + policy_loss(-nll, batch.tgt_out)
        return loss, nll.sum()

    def validate(self, model: torch.nn.Module, device: torch.device, autocast: Callable) -> dict[str, float]:
        """Loss and perplexity, then the scores of greedy outputs (:meth:`output_scores`)."""
        src, tgt = self.valid_ids
        lengths = [len(s) + 1 for s in src], [len(t) + 1 for t in tgt]
        groups = token_batches(*lengths, self.config.train.max_tokens, seed=0, epoch=0, shuffle=False)
        specials = self.tokenizer.specials
        batches = (make_batch([src[i] for i in b], [tgt[i] for i in b], specials) for b in groups)
        scores = validation_loss(self.loss, model, batches, device, autocast)
        # Scoring outputs needs decoding, the slow part; train.valid_bleu_sentences limits it to a prefix.
        n = self.config.train.valid_bleu_sentences or len(self.data.valid)
        return {**scores, **self.output_scores(model, device, n)}

    @classmethod
    def prepare_store(cls, config: RunConfig, echo: Callable[[str], None]) -> None:
        """``attnkit prepare``: the training pairs (or summaries) read, encoded and kept in a token store."""
        prepare_data(config.data, config.train.seed, echo=echo)

    def output_scores(self, model: torch.nn.Module, device: torch.device, n: int) -> dict[str, float]:
        """BLEU and exact-match accuracy of the greedy translations of the first ``n`` sources."""
        valid = self.data.valid
        hypotheses = translate(model, self.tokenizer, valid.src[:n], while_training(self.config), beam_size=1)
        return {
            "valid_bleu": bleu(hypotheses, valid.tgt[:n]).score,
            "valid_accuracy": exact_match(hypotheses, valid.tgt[:n]),
        }

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
        """Each input's translation, by the run's decode settings (as ``attnkit translate``); a
        summariser's sources are cut to the length it was trained on (``data.max_source_len``)."""
        limit = config.data.source_limit if cls.cuts_sources else None
        return translate(model, tokenizer, list(inputs), config.decode, source_limit=limit)

    @classmethod
    def score(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        config: RunConfig,
        given: Given,
        device: torch.device | str,
    ) -> list[str]:
        """sacreBLEU's BLEU and chrF of the translations of ``given.src`` against ``given.ref``."""

        def run(texts: list[str], progress: Callable[[int], None]) -> list[str]:
            return translate(model, tokenizer, texts, config.decode, beam_size=given.beam,
                             reporting=Reporting(given.warn, progress))  # fmt: skip

        return score_translations(run, given)


def score_translations(
    run: Callable[[list[str], Callable[[int], None]], list[str]], given: Given
) -> list[str]:
    """BLEU and chrF of ``run``'s translations (``run(sources, progress)``: attnkit's or CTranslate2's)
    of every line of ``given.src`` against the line of ``given.ref`` beside it, an empty source scored
    as an empty translation; and the counts of empty sources and references."""
    pairs = read_parallel(given.src, given.ref, drop_empty=False)
    began = time.perf_counter()
    with given.progress(len(pairs)) as bar:
        hypotheses = run(pairs.src, bar.update)
    seconds = time.perf_counter() - began
    empty_src, empty_ref = pairs.count_empty()
    return [
        str(bleu(hypotheses, pairs.tgt)),
        str(chrf(hypotheses, pairs.tgt)),
        f"{len(pairs)} sentences in {seconds:.1f} s; {empty_src} with an empty source (scored as an "
        f"empty translation), {empty_ref} with an empty reference",
    ]


class SummarisationTask(TranslationTask):
    """Summarisation: translation's batches and loss; validation by ROUGE of greedy summaries against
    every reference (the best one counting), on sources cut as in training."""

    cuts_sources: ClassVar[bool] = True  # an email's beginning: all a summariser has ever read
    scoring: ClassVar[Scoring] = Scoring(
        files=("data",), asks="evaluate it with --data FILE.jsonl", decodes=True,
        holder="a summariser",
    )  # fmt: skip

    def validation_ids(self, valid: ParallelText) -> tuple[list[list[int]], list[list[int]]]:
        """The sources cut as the training sources are (``data.max_source_len``)."""
        src, tgt = super().validation_ids(valid)
        return cut_sources(src, self.config.data.source_limit)[0], tgt

    def output_scores(self, model: torch.nn.Module, device: torch.device, n: int) -> dict[str, float]:
        """ROUGE-1/2/L F1 of the greedy summaries of the first ``n`` sources (as cut for training)."""
        valid = self.data.valid
        texts = [self.tokenizer.decode(ids) for ids in self.valid_ids[0][:n]]
        hypotheses = translate(model, self.tokenizer, texts, while_training(self.config), beam_size=1)
        r1, r2, rl = rouge(hypotheses, (valid.references or [[t] for t in valid.tgt])[:n])
        return {"valid_rouge1": r1.score, "valid_rouge2": r2.score, "valid_rougeL": rl.score}

    @classmethod
    def score(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        config: RunConfig,
        given: Given,
        device: torch.device | str,
    ) -> list[str]:
        """ROUGE of the summaries of ``given.data``'s sources, cut as in training, against the target
        field and, where the run names one (``data.references``), against those references (the best
        counting)."""
        records = read_summaries(config.data, given.data)
        _, cut = cut_sources(tokenizer.encode_batch(records.src), config.data.source_limit)
        began = time.perf_counter()
        limit = config.data.source_limit
        summaries = translate(
            model,
            tokenizer,
            records.src,
            config.decode,
            beam_size=given.beam,
            source_limit=limit,
        )
        seconds = time.perf_counter() - began
        lines = []
        for field, refs in records.references.items():
            scores = rouge(summaries, refs)
            lines.append(f"against {field!r}: " + ", ".join(f"{s.name} {s.score:.2f}" for s in scores))
        lines.append(
            f"({scores[0].signature}); {len(records)} records in {seconds:.1f} s, {cut} sources cut "
            f"to {limit} tokens"
        )
        return lines
