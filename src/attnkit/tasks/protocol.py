"""What every task offers, written down once: the trainer calls its batches, loss and validation and
never asks which task it has, and a trained model's commands call its ``infer`` (``attnkit predict``,
``translate``) and ``score`` (``attnkit evaluate``) (tests/tasks/test_protocol.py checks each task
against it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from attnkit.config import RunConfig
from attnkit.data.tokenizer import Tokenizer

# what makes a run's task: (the run config, the tokenizer to use or None to learn one, echo) -> the task
TaskFactory = Callable[[RunConfig, Tokenizer | None, Callable[[str], None]], "Task"]


@dataclass(frozen=True)
class Scoring:
    """What ``attnkit evaluate`` scores a task's model on, checked before the model is loaded."""

    files: tuple[str, ...]  # the options naming its files: ("src", "ref"), ("data",); (): its own test data
    asks: str  # what its error asks for when they are missing: "evaluate it with --data FILE.tsv"
    decodes: bool = False  # takes decode settings (decode.field=value), --beam and --streams
    heads: tuple[str, ...] = ()  # an encoder: the heads it scores (another head is a one-line error)
    holder: str = ""  # what its errors call the model ("a summariser"; default: its architecture's name)


@dataclass(frozen=True)
class Given:
    """What ``attnkit evaluate`` hands a task's ``score``: the files and the beam it was given, and the
    command's progress bar (``with progress(total) as bar: bar.update(n)``) and notes."""

    src: Path | None
    ref: Path | None
    data: Path | None
    beam: int | None
    progress: Callable[[int], Any]
    warn: Callable[[str], None]


class Task(Protocol):
    """A task: its data, how a batch is made, the loss, the validation scores, and what a trained model
    does with new inputs."""

    unit: ClassVar[str]  # what the loss is summed over, for the speed shown ("target tokens", "images")
    tokenizer: Tokenizer | None  # None for an image task: its checkpoints hold no tokenizer.json
    scoring: ClassVar[Scoring]  # what attnkit evaluate scores its model on

    def epoch_batches(self, epoch: int) -> list[Any]:
        """Cheap descriptions of the epoch's batches, the same for the same seed and epoch, so that a
        run resumes in the middle of an epoch."""
        ...

    def make_batch(self, description: Any) -> Any:
        """The batch a description names (it has ``to(device)``)."""
        ...

    def loss(self, model: torch.nn.Module, batch: Any) -> tuple[Tensor, Tensor]:
        """The summed loss to minimise and the summed NLL, over the batch's ``n_tokens`` predictions."""
        ...

    def validate(self, model: torch.nn.Module, device: torch.device, autocast: Callable) -> dict[str, float]:
        """The validation scores (``valid_loss`` and the task's own, as its record's ``metrics`` name
        them: ``attnkit/task_records.py``)."""
        ...

    @classmethod
    def infer(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        config: RunConfig,
        inputs: Sequence[Any],
        device: torch.device | str,
        where: str = "input",
        first: int = 1,
    ) -> list[str]:
        """What a model trained on this task makes of new inputs, one line of text per input (a
        translation, a continuation, a label and its probability, ...), with the run's ``config``
        (its decode settings); it reads no data. A bad input is an ``AttnkitError`` naming
        ``where:number`` (``where``: a file's name, say; ``first``: the number of the first input, for
        a part of a longer file)."""
        ...

    @classmethod
    def score(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        config: RunConfig,
        given: Given,
        device: torch.device | str,
    ) -> list[str]:
        """The lines ``attnkit evaluate`` prints: the scores of a model trained on this task on the files
        ``given`` names (as ``scoring`` asks for them), with the run's ``config`` (its decode settings),
        and how long scoring took."""
        ...
