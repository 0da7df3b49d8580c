"""Every task offers the trainer what tasks/protocol.py's ``Task`` lists, with the same parameters: the
one place the trainer's view of a task is written down."""

import inspect
import typing

import pytest

from attnkit.tasks import TASK_CLASSES
from attnkit.tasks.protocol import Task

METHODS = [name for name, value in vars(Task).items() if inspect.isfunction(value) and name[0] != "_"]
ATTRIBUTES = list(typing.get_type_hints(Task))


def test_the_protocol_names_the_trainers_calls_and_inference():
    assert METHODS == ["epoch_batches", "make_batch", "loss", "validate"]
    assert isinstance(vars(Task)["infer"], classmethod)  # a trained model's commands: no data is read
    assert ATTRIBUTES == ["unit", "metrics", "tokenizer"]


def _parameters(function) -> int:
    return len(inspect.signature(function).parameters) - 1  # without self


@pytest.mark.parametrize("task", sorted(set(TASK_CLASSES.values()), key=lambda c: c.__name__))
def test_each_task_offers_the_protocol(task):
    """Each method the trainer calls, taking what the trainer passes (by position: a task names its batch
    description as what it is, ``indices`` or ``starts``), the attributes it reads, and validation
    scores named as the trainer looks them up."""
    for name in METHODS:
        assert _parameters(getattr(task, name)) == _parameters(getattr(Task, name)), (task, name)
    infer = inspect.signature(task.infer)  # bound to the class: without cls
    assert list(infer.parameters) == list(inspect.signature(Task.infer).parameters), task
    assert isinstance(inspect.getattr_static(task, "infer"), classmethod), task
    assert isinstance(task.unit, str) and task.unit
    assert "loss" in task.metrics and all(v.startswith("valid_") for v in task.metrics.values())
    assert "self.tokenizer" in "".join(inspect.getsource(c) for c in task.__mro__ if c is not object)
