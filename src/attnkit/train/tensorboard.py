"""TensorBoard event files for a long run (``train.log: [csv, tensorboard]``).

``metrics.csv`` has a row per validation; a run of days needs live curves too. Every ``train.log_every``
steps the trainer writes the training loss, learning rate, speed and gradient norm, and at every
validation the task's scores and the memory the process has used at most, into ``RUN/tensorboard``
(``tensorboard --logdir runs`` shows every run). Only the process that writes checkpoints writes
events. A resumed run starts its events where its checkpoint was saved, so that steps an interrupted
run logged after its last checkpoint are dropped (TensorBoard's ``purge_step``), not drawn twice.

TensorBoard's writer comes with the ``tensorboard`` package (``pip install 'attnkit[tensorboard]'``);
without it, ``train.log`` naming tensorboard is a one-line error before any data is read.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

from attnkit.errors import ConfigError


def require_tensorboard() -> None:
    """A one-line error unless TensorBoard's writer can be imported (torch's needs the tensorboard
    package): called before a run reads any data."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise ConfigError(
            "train.log names tensorboard, but the tensorboard package is not installed: "
            "pip install 'attnkit[tensorboard]' (or tensorboard)"
        ) from None


class TensorBoardLog:
    """Scalars into ``folder``'s event files: ``log.add(step, {"train/loss": 2.3, ...})``; events of
    steps from ``first_step`` on that an earlier writer left there are dropped."""

    def __init__(self, folder: Path, first_step: int = 0) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(folder), purge_step=first_step or None)

    def add(self, step: int, scalars: dict[str, float | None]) -> None:
        for name, value in scalars.items():
            if value is not None:
                self.writer.add_scalar(name, value, step)
        self.writer.flush()  # a run watched live, or killed, has its numbers on disk

    def close(self) -> None:
        self.writer.close()


def memory_used(device: torch.device) -> dict[str, float]:
    """The most memory this process has held so far, in GB: its peak resident set, and on a GPU the
    peak of tensors allocated there."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux, bytes on macOS
    memory = {"memory/peak_rss_gb": peak / (1e9 if sys.platform == "darwin" else 1e6)}
    if device.type == "cuda":
        memory["memory/peak_cuda_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    return memory
