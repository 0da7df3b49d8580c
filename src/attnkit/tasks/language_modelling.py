"""Language modelling: predict every next token of raw text with a decoder-only model (GPT).

Data are UTF-8 text files (``data.task: text``): ``data.train: [file]`` and ``data.valid: [file]``, or,
without a validation file, the last ``data.valid_fraction`` of the training text (nanoGPT's split of
tiny Shakespeare: the first 90% of the characters for training, the last 10% for validation). Each text
is tokenised as one stream.

A training example is a block of ``model.max_len`` tokens, its targets the same block one token later.
An epoch cuts the stream into consecutive whole blocks starting at a random offset (drawn from the seed
and the epoch, so a resumed run sees the same blocks) and shuffles them: every token but those before
the offset and after the last whole block is seen once per epoch.
A batch holds ``train.max_tokens // model.max_len`` blocks. Validation runs over the whole validation
stream in consecutive blocks and reports the loss and perplexity per token; ``text_perplexity`` scores
any text the same way (``attnkit evaluate --data FILE.txt``).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from tokenizers import pre_tokenizers
from torch import Tensor

from attnkit.config import DataConfig, RunConfig
from attnkit.data.readers import iter_lines, read_text
from attnkit.data.store import TokenStore, in_blocks, prepared, store_root, uniform_sample
from attnkit.data.text_blocks import Blocks, blocks_at, stream_blocks, text_ids
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.generate import generate
from attnkit.errors import DataError
from attnkit.models import evaluating
from attnkit.tasks.losses import generative_loss
from attnkit.tasks.protocol import Given, Scoring
from attnkit.tasks.validation import validation_loss


def prepared_text(config: DataConfig, tokenizer: Tokenizer | None, echo: Callable[[str], None]) -> TokenStore:
    """The training and validation token streams as a store (data/store.py), columns ``train`` and
    ``valid``: each column's ids, one row after another, are its stream. Built the first time (the
    tokenizer learned from up to ``data.tokenizer_sample`` lines of the training text), found afterwards
    without reading the text.

    The text is read and encoded a chunk of lines at a time (:func:`_encoded`), so that the ids put
    together are the whole text's (tested) and no more than a chunk is in memory."""
    files = [config.path(config.train[0]), *([config.path(config.valid[0])] if config.valid else [])]
    for path in files:
        if not path.is_file():
            raise DataError(f"{path}: file not found")
    settings = {"task": config.task, "tokenizer": config.tokenizer, "vocab_size": config.vocab_size,
                "valid_fraction": None if config.valid else config.valid_fraction}  # fmt: skip

    def build(given: Tokenizer | None):
        cut = None if config.valid else _valid_cut(files[0], config.valid_fraction)
        made_with = given or Tokenizer.train(
            config.tokenizer,
            uniform_sample(_texts(files, "train", cut), config.tokenizer_sample),
            config.vocab_size,
        )

        def rows() -> Iterator[tuple[list[int], list[int]]]:
            for column in ("train", "valid"):
                for ids in _encoded(made_with, _texts(files, column, cut)):
                    yield (ids, []) if column == "train" else ([], ids)

        return made_with, ("train", "valid"), rows(), {}

    return prepared(store_root(config.store), files, settings, tokenizer, build, echo)


def _valid_cut(path: Path, valid_fraction: float) -> int:
    """Where a training file without a validation file is split: at ``1 - valid_fraction`` of its
    characters (counted once, streamed)."""
    total = sum(len(line) for line in _nonempty(path))
    cut = int(total * (1 - valid_fraction))
    if cut == 0 or cut == total:
        raise DataError(f"{path}: too short to hold out data.valid_fraction for validation")
    return cut


def _texts(files: list[Path], column: str, cut: int | None) -> Iterator[str]:
    """The ``train`` or ``valid`` text's lines with their endings, streamed: the two files, or (``cut``
    given) the training file split at character ``cut`` (the split cuts a line in two)."""
    if cut is None:
        yield from _nonempty(files[0 if column == "train" else 1])
        return
    seen = 0
    for line in iter_lines(files[0], keep_endings=True):
        before, seen = seen, seen + len(line)
        if column == "train" and before < cut:
            yield line[: cut - before]
        elif column == "valid" and seen > cut:
            yield line[max(0, cut - before) :]


def _nonempty(path: Path) -> Iterator[str]:
    """The lines of ``path`` with their endings; a file of whitespace alone is an error."""
    text = False
    for line in iter_lines(path, keep_endings=True):
        text = text or bool(line.strip())
        yield line
    if not text:
        raise DataError(f"{path}: file is empty")


def _encodes_in_chunks(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` gives a text's ids chunk by chunk (:func:`_chunks`): no normaliser, and
    characters or whitespace-split words."""
    pre = tokenizer.hf.pre_tokenizer
    return tokenizer.hf.normalizer is None and (
        pre is None or isinstance(pre, pre_tokenizers.WhitespaceSplit)
    )


SEAM = "\nx"  # what byte-level BPE encodes around a chunk: a line's end before it, a letter after it
CHUNKS_AT_ONCE = 8  # chunks encoded together (in parallel, by the tokenizers library's threads)


def _encoded(tokenizer: Tokenizer, lines: Iterable[str]) -> Iterator[list[int]]:
    """The ids of the text made of ``lines``, a chunk (:func:`_chunks`) at a time, ``CHUNKS_AT_ONCE``
    chunks encoded in parallel: put together, the ids of the whole text.

    Characters and words: each chunk's own ids. Byte-level BPE puts a space before each text it
    encodes, and its pre-tokenizer splits a run of whitespace differently at a text's end ("\\n\\n" one
    piece) than before a word ("\\n", "\\n"). A chunk boundary falls between a line's end and a
    non-space character, where no piece can span it; so a chunk is encoded with a line's end before it
    (the space goes there) and a letter after it (its whitespace splits as before the next chunk's
    first word), and the ids of those two ends are dropped: one id each for the space, the line's end
    and the letter, single bytes, which BPE never merges across pieces. Other tokenizers: the text
    whole."""
    framed = isinstance(tokenizer.hf.pre_tokenizer, pre_tokenizers.ByteLevel)
    if not (_encodes_in_chunks(tokenizer) or framed):
        yield tokenizer.encode("".join(lines))
        return
    seam = tokenizer.encode(SEAM)  # (" ", "\n", "x")
    for block in in_blocks(_with_neighbours(_chunks(lines)), CHUNKS_AT_ONCE):
        if not framed:
            yield from tokenizer.encode_batch([chunk for chunk, _, _ in block])
            continue
        texts = [SEAM[0] * (not first) + chunk + SEAM[1] * (not last) for chunk, first, last in block]
        for ids, (_, first, last) in zip(tokenizer.encode_batch(texts), block, strict=True):
            head, tail = 2 * (not first), 1 * (not last)
            if ids[:head] != seam[:head] or ids[len(ids) - tail :] != seam[len(seam) - tail :]:
                raise AssertionError("a byte-level BPE chunk's edges did not encode as single bytes")
            yield ids[head : len(ids) - tail]


def _with_neighbours(chunks: Iterator[str]) -> Iterator[tuple[str, bool, bool]]:
    """Each chunk, whether it is the first, and whether it is the last."""
    chunk, first = next(chunks, None), True
    while chunk is not None:
        following = next(chunks, None)
        yield chunk, first, following is None
        chunk, first = following, False


def _chunks(lines: Iterable[str], size: int = 1 << 20) -> Iterator[str]:
    """``lines`` joined into chunks of at least ``size`` characters, each ending before a line that starts
    with a character other than whitespace (where no tokenizer's pre-token spans the boundary)."""
    chunk, length = [], 0
    for line in lines:
        if length >= size and line[:1] and not line[:1].isspace():
            yield "".join(chunk)
            chunk, length = [], 0
        chunk.append(line)
        length += len(line)
    if chunk:
        yield "".join(chunk)


def read_texts(config: DataConfig) -> tuple[str, str]:
    """The training and validation text: two files, or one file split at ``1 - valid_fraction``."""
    train = read_text(config.path(config.train[0]))
    if config.valid:
        return train, read_text(config.path(config.valid[0]))
    cut = int(len(train) * (1 - config.valid_fraction))
    if cut == 0 or cut == len(train):
        raise DataError(
            f"{config.path(config.train[0])}: too short to hold out data.valid_fraction for validation"
        )
    return train[:cut], train[cut:]


class LanguageModellingTask:
    """The trainer's view of language modelling: batches, loss and validation (see the module docstring)."""

    unit: ClassVar[str] = "tokens"  # what the loss is summed over (the speed shown is tokens/s)
    scoring: ClassVar[Scoring] = Scoring(files=("data",), asks="evaluate its perplexity with --data FILE.txt")

    def __init__(self, config: RunConfig, tokenizer: Tokenizer | None, echo: Callable[[str], None]) -> None:
        self.config = config
        store = prepared_text(config.data, tokenizer, echo)
        self.tokenizer = store.tokenizer
        self.train_ids = store.columns["train"].ids  # (N,) memory-mapped: blocks are read as batches need
        self.valid_ids = torch.from_numpy(store.columns["valid"].ids.astype(np.int64))
        tokenizer = self.tokenizer
        self.block = config.model.max_len
        for name, ids in (("training", self.train_ids), ("validation", self.valid_ids)):
            if len(ids) < 2:
                raise DataError(f"the {name} text has {len(ids)} token(s); a language model needs at least 2")
        self.per_batch = max(1, config.train.max_tokens // self.block)
        sizes = f"training tokens: {len(self.train_ids):,}; validation: {len(self.valid_ids):,}"
        echo(
            f"{sizes}; vocabulary: {tokenizer.vocab_size:,}; batches of {self.per_batch}×{self.block} tokens"
        )

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This epoch's batches of block start positions, the same for the same (seed, epoch)."""
        rng = random.Random(self.config.train.seed * 1_000_003 + epoch)
        block = min(self.block, len(self.train_ids) - 1)  # a text shorter than a block is one block
        span = len(self.train_ids) - 1  # the last token is only ever a target
        offset = rng.randrange(min(block, span - block + 1))  # leaves room for at least one block
        starts = list(range(offset, span - block + 1, block))  # whole blocks only
        rng.shuffle(starts)
        return [starts[i : i + self.per_batch] for i in range(0, len(starts), self.per_batch)]

    def make_batch(self, starts: list[int]) -> Blocks:
        return blocks_at(self.train_ids, starts, min(self.block, len(self.train_ids) - 1))

    def loss(self, model: torch.nn.Module, batch: Blocks) -> tuple[Tensor, Tensor]:
        """Summed (label-smoothed) loss and NLL over every predicted token."""
        smoothed, nll = generative_loss(
            model,
            (batch.inputs,),
            batch.targets,
            self.config.train.label_smoothing,
            self.tokenizer.specials.pad,
        )
        return smoothed, nll.sum()

    def validate(self, model: torch.nn.Module, device: torch.device, autocast: Callable) -> dict[str, float]:
        """Loss and perplexity per token over the whole validation text."""
        blocks = stream_blocks(self.valid_ids, self.block, self.per_batch)
        return validation_loss(self.loss, model, blocks, device, autocast)

    @classmethod
    def prepare_store(cls, config: RunConfig, echo: Callable[[str], None]) -> None:
        """``attnkit prepare``: the training text encoded into a token store (:func:`prepared_text`)."""
        prepared_text(config.data, None, echo)

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
        """Each prompt's continuation (without the prompt), by the run's decode settings (as ``attnkit
        generate``)."""
        return generate(model, tokenizer, list(inputs), config.decode)

    @classmethod
    def score(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        config: RunConfig,
        given: Given,
        device: torch.device | str,
    ) -> list[str]:
        """The cross-entropy and perplexity on the text of ``given.data``, in blocks of the model's
        context, ``train.max_tokens`` a batch (as training validates)."""
        per_batch = max(1, config.train.max_tokens // config.model.max_len)
        scored = text_perplexity(model, tokenizer, read_text(given.data), per_batch, device)
        return [perplexity_line(scored, config.model.max_len)]


def perplexity_line(scored: dict[str, float], context: int) -> str:
    """What ``attnkit evaluate`` says of a perplexity (:func:`text_perplexity`'s, or CTranslate2's)."""
    return (
        f"perplexity = {scored['perplexity']:.3f} (cross-entropy {scored['loss']:.4f} nats per token, "
        f"{scored['tokens']:,} tokens predicted in blocks of {context})"
    )


@torch.no_grad()
def text_perplexity(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    text: str,
    per_batch: int,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """A decoder model's cross-entropy (nats per token) and perplexity on ``text``, tokenised as one
    stream and read in blocks of the model's context (:func:`stream_blocks`), as training validates;
    ``tokens``: how many were predicted."""
    ids = text_ids(tokenizer, text)

    def nll(model: torch.nn.Module, batch: Blocks) -> tuple[Tensor, Tensor]:  # (loss, nll): both unsmoothed
        _, token_nll = generative_loss(model, (batch.inputs,), batch.targets, 0.0, tokenizer.specials.pad)
        total = token_nll.sum()
        return total, total

    with evaluating(model):
        blocks = stream_blocks(ids, model.config.max_len, per_batch)
        scored = validation_loss(nll, model, blocks, torch.device(device), contextlib.nullcontext)
    return {"loss": scored["valid_loss"], "perplexity": scored["valid_ppl"], "tokens": len(ids) - 1}
