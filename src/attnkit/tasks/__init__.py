"""Tasks: how a batch is made from data, the loss, the validation metrics. One module per task; the
trainer calls the task's methods and never branches on which task it is.

| ``data.task`` | task | model (``model.arch``) |
|---|---|---|
| ``parallel``, ``dates``, ``copy`` | translation (``translation.py``) | ``encoder-decoder`` |
| ``text`` | language modelling (``language_modelling.py``) | ``decoder`` |

A task offers ``tokenizer``, ``metrics`` (``train.eval_metric`` name -> validation score; ``loss`` is
better lower, the others higher), ``epoch_batches(epoch)`` (cheap descriptions of the epoch's batches,
the same for the same seed and epoch, so a run resumes mid-epoch), ``make_batch(description)``,
``loss(model, batch)`` (summed loss and NLL, and the batch's ``n_tokens``) and
``validate(model, device, autocast)``.
"""

from __future__ import annotations

from collections.abc import Callable

from attnkit.config import RunConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.tasks.language_modelling import LanguageModellingTask
from attnkit.tasks.translation import TranslationTask

Task = TranslationTask | LanguageModellingTask


def make_task(config: RunConfig, tokenizer: Tokenizer | None, echo: Callable[[str], None]) -> Task:
    """The task that ``data.task`` names, with its data read (and a tokenizer learned if none is given)."""
    if config.data.task == "text":
        return LanguageModellingTask(config, tokenizer, echo)
    return TranslationTask(config, tokenizer, echo)
