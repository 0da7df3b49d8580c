"""Tasks: how a batch is made from data, the loss, the validation metrics, inference. One module per task;
the trainer calls the task's methods and never branches on which task it is.

Which class does which ``data.task`` (and the architectures each trains, its metrics and files) is
the task's record's to say, in the one table of them (``attnkit/task_records.py``): :func:`make_task`
builds the class a record names, importing only that task's module.

Every task offers what ``protocol.py``'s :class:`Task` lists (batches, loss, validation, and ``infer``:
what a model trained on it makes of new inputs). A task may fill
in what only its data can say (a classifier's labels) in the run config it is given, which is then saved
with the checkpoints.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from attnkit.config import RunConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.task_records import task_record
from attnkit.tasks.protocol import Task


def task_class(name: str) -> type[Task]:
    """The class that does ``data.task=name``, as its record names it (its module imported now: a
    run imports only its own task's code)."""
    module, _, cls = task_record(name).implementation.partition(":")
    return getattr(importlib.import_module(module), cls)


def make_task(config: RunConfig, tokenizer: Tokenizer | None, echo: Callable[[str], None]) -> Task:
    """The task that ``data.task`` names, with its data read (and a tokenizer learned if none is given)."""
    return task_class(config.data.task)(config, tokenizer, echo)


def task_of(config: RunConfig) -> type[Task]:
    """The task class a run of ``config`` trained on, whose :meth:`Task.infer` says what its model does
    with new inputs (nothing is read)."""
    return task_class(config.data.task)
