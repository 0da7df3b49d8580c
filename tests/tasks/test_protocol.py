"""Every task offers the trainer what tasks/protocol.py's ``Task`` lists, with the same parameters: the
one place the trainer's view of a task is written down."""

import inspect
import typing

import pytest

from attnkit.config import RunConfig
from attnkit.errors import AttnkitError
from attnkit.task_records import TASK_RECORDS
from attnkit.tasks import task_class
from attnkit.tasks.classification import ClassificationTask
from attnkit.tasks.masked_lm import MaskedLMTask
from attnkit.tasks.protocol import Given, Scoring, Task
from attnkit.tasks.span_qa import SpanQATask

CLASSES = sorted({task_class(name) for name in TASK_RECORDS}, key=lambda c: c.__name__)
METHODS = [name for name, value in vars(Task).items() if inspect.isfunction(value) and name[0] != "_"]
ATTRIBUTES = list(typing.get_type_hints(Task))


def test_the_protocol_names_the_trainers_calls_and_inference():
    assert METHODS == ["epoch_batches", "make_batch", "loss", "validate"]
    for command in ("infer", "score"):  # a trained model's commands: no training data is read
        assert isinstance(vars(Task)[command], classmethod), command
    assert ATTRIBUTES == ["unit", "tokenizer", "scoring"]


def _parameters(function) -> int:
    return len(inspect.signature(function).parameters) - 1  # without self


@pytest.mark.parametrize("task", CLASSES)
def test_each_task_offers_the_protocol(task):
    """Each method the trainer calls, taking what the trainer passes (by position: a task names its batch
    description as what it is, ``indices`` or ``starts``), the attributes it reads, and validation
    scores named as the trainer looks them up."""
    for name in METHODS:
        assert _parameters(getattr(task, name)) == _parameters(getattr(Task, name)), (task, name)
    for command in ("infer", "score"):
        taken = inspect.signature(getattr(task, command))  # bound to the class: without cls
        assert list(taken.parameters) == list(inspect.signature(getattr(Task, command)).parameters), task
        assert isinstance(inspect.getattr_static(task, command), classmethod), (task, command)
    assert isinstance(task.scoring, Scoring) and set(task.scoring.files) <= {"src", "ref", "data"}
    assert isinstance(task.unit, str) and task.unit
    assert "self.tokenizer" in "".join(inspect.getsource(c) for c in task.__mro__ if c is not object)


@pytest.mark.parametrize("task", [MaskedLMTask, SpanQATask], ids=["masked-LM", "question answering"])
def test_an_encoder_trained_on_another_task_is_asked_for_labelled_sentences_and_its_score_refuses(task):
    """attnkit evaluate scores an encoder as a classifier: it asks any encoder for --data FILE.tsv, and the
    head check refuses these before ``score``; called anyway, ``score`` refuses in one line too."""
    assert task.scoring == ClassificationTask.scoring and task.scoring.heads == ("classify",)
    config = RunConfig()
    config.model.arch, config.model.head = "encoder", "span"
    given = Given(src=None, ref=None, data=None, beam=None, progress=None, warn=print)
    with pytest.raises(AttnkitError, match="scores a classifier, not a model with a span head"):
        task.score(None, None, config, given, "cpu")
