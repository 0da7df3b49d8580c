"""Tasks: how a batch is made from data, the loss, the validation metrics, inference. One module per task;
the trainer calls the task's methods and never branches on which task it is.

| ``data.task`` | task | model (``model.arch``, ``model.head``) |
|---|---|---|
| ``parallel``, ``dates``, ``copy`` | translation (``translation.py``) | ``encoder-decoder`` |
| ``text`` | language modelling (``language_modelling.py``) | ``decoder`` |
| ``classify`` | sequence classification (``classification.py``) | ``encoder``, ``classify`` |
| ``mlm`` | masked-LM pre-training (``masked_lm.py``) | ``encoder``, ``mlm`` |
| ``qa`` | extractive question answering (``span_qa.py``) | ``encoder``, ``span`` |
| ``cluttered-digits`` | image classification (``image_classification.py``) | ``glimpse``, ``whole-image`` |
| ``captions`` | image captioning (``captioning.py``) | ``show-attend-tell``, ``caption-transformer`` |
| ``speech`` | speech recognition (``speech.py``) | ``listen-attend-spell`` |

Every task offers what ``protocol.py``'s :class:`Task` lists (batches, loss, validation, and ``infer``:
what a model trained on it makes of new inputs). A task may fill
in what only its data can say (a classifier's labels) in the run config it is given, which is then saved
with the checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable

from attnkit.config import CAPTION_TASK, IMAGE_TASK, SPEECH_TASK, SUMMARY_TASK, TRANSLATION_TASKS, RunConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.tasks.captioning import CaptioningTask
from attnkit.tasks.classification import ClassificationTask
from attnkit.tasks.image_classification import ImageClassificationTask
from attnkit.tasks.language_modelling import LanguageModellingTask
from attnkit.tasks.masked_lm import MaskedLMTask
from attnkit.tasks.protocol import Task
from attnkit.tasks.span_qa import SpanQATask
from attnkit.tasks.speech import SpeechTask
from attnkit.tasks.translation import SummarisationTask, TranslationTask

TASK_CLASSES: dict[str, type] = {
    **dict.fromkeys(TRANSLATION_TASKS, TranslationTask),
    SUMMARY_TASK: SummarisationTask,
    "text": LanguageModellingTask,
    "classify": ClassificationTask,
    "mlm": MaskedLMTask,
    "qa": SpanQATask,
    IMAGE_TASK: ImageClassificationTask,
    CAPTION_TASK: CaptioningTask,
    SPEECH_TASK: SpeechTask,
}


def make_task(config: RunConfig, tokenizer: Tokenizer | None, echo: Callable[[str], None]) -> Task:
    """The task that ``data.task`` names, with its data read (and a tokenizer learned if none is given)."""
    return TASK_CLASSES[config.data.task](config, tokenizer, echo)


def task_of(config: RunConfig) -> type[Task]:
    """The task class a run of ``config`` trained on, whose :meth:`Task.infer` says what its model does
    with new inputs (nothing is read)."""
    return TASK_CLASSES[config.data.task]
