"""What every task offers the trainer, written down once: the trainer calls these and never asks which
task it has (tests/tasks/test_protocol.py checks each task against it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from attnkit.data.tokenizer import Tokenizer


class Task(Protocol):
    """A task: its data, how a batch is made, the loss, and the validation scores."""

    unit: ClassVar[str]  # what the loss is summed over, for the speed shown ("target tokens", "images")
    metrics: ClassVar[dict[str, str]]  # train.eval_metric name -> validation score ("loss" lower is better)
    tokenizer: Tokenizer | None  # None for an image task: its checkpoints hold no tokenizer.json

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
        """The validation scores (``valid_loss`` and the task's own, as ``metrics`` names them)."""
        ...
