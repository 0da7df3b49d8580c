"""From a data config to encoded training pairs and validation text, with counts of what was dropped."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attnkit.config import DataConfig
from attnkit.data.readers import ParallelText, read_parallel
from attnkit.data.synthetic import generate
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import ConfigError


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    train_src: list[list[int]]
    train_tgt: list[list[int]]
    valid: ParallelText


def read_split(config: DataConfig, split: str, seed: int, drop_empty: bool = True) -> ParallelText:
    """The ``train``/``valid``/``test`` split: generated for synthetic tasks, read from files otherwise
    (``drop_empty`` as in :func:`read_parallel`)."""
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


def prepare_data(
    config: DataConfig, seed: int, tokenizer: Tokenizer | None = None, echo: Callable[[str], None] = print
) -> PreparedData:
    """Read (or generate), learn the tokeniser if none is given, encode, and drop over-long pairs."""
    train, valid = read_split(config, "train", seed), read_split(config, "valid", seed)
    for name, split in (("training", train), ("validation", valid)):
        if split.dropped_empty:
            echo(f"dropped {split.dropped_empty} {name} pairs with an empty side")
    if tokenizer is None:
        tokenizer = Tokenizer.train(config.tokenizer, train.src + train.tgt, config.vocab_size)
    src, tgt = tokenizer.encode_batch(train.src), tokenizer.encode_batch(train.tgt)
    # +1 for </s> (source) or <s>/</s> (target); pairs are dropped together to keep alignment.
    keep = [
        i for i in range(len(src)) if len(src[i]) + 1 <= config.max_len and len(tgt[i]) + 1 <= config.max_len
    ]
    if len(keep) < len(src):
        echo(
            f"dropped {len(src) - len(keep)} training pairs longer than data.max_len={config.max_len} tokens"
        )
    if not keep:
        raise ConfigError(f"data.max_len={config.max_len} leaves no training pair")
    echo(f"training pairs: {len(keep):,}; validation: {len(valid):,}; vocabulary: {tokenizer.vocab_size:,}")
    return PreparedData(tokenizer, [src[i] for i in keep], [tgt[i] for i in keep], valid)
