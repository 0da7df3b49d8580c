"""The one table of tasks: what each ``data.task`` trains, how it is judged and what data it reads.

A task's record says which architectures it trains (the models themselves know no tasks), the head an
encoder needs for it, its validation metrics and the score each reads, the files it takes per split and
which of them training needs, whether ``attnkit prepare`` encodes its data into a token store, and the
class that does it (in ``attnkit.tasks``). The run config checks a run against these records,
``attnkit.tasks.make_task`` builds the class a record names, and the command line reads them: no other
place lists task names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnkit.errors import require_one_of
from attnkit.models.caption_transformer import CaptionTransformerConfig
from attnkit.models.captioner import CaptionerConfig
from attnkit.models.config import DecoderModelConfig, EncoderModelConfig, TransformerConfig
from attnkit.models.glimpse import GlimpseConfig, WholeImageConfig
from attnkit.models.listen_attend_spell import ListenAttendSpellConfig
from attnkit.models.rnn import RNNConfig

_TRANSLATION_ARCHS = (TransformerConfig.ARCH, RNNConfig.ARCH)  # the encoder-decoders of text
_TRANSLATION_METRICS = {"bleu": "valid_bleu", "accuracy": "valid_accuracy", "loss": "valid_loss"}


@dataclass(frozen=True)
class TaskRecord:
    """What one ``data.task`` is (see the module's docstring)."""

    name: str  # the data.task value
    implementation: str  # "attnkit.tasks.translation:TranslationTask": the module and class that do it
    trains: tuple[str, ...]  # the model.arch values it trains
    # train.eval_metric -> the validation score it reads (lower is better for cer, wer, loss); the first
    # is the default
    metrics: dict[str, str] = field(hash=False)
    head: str | None = None  # the model.head an encoder needs for it
    files: int = 0  # files per split (data.train, data.valid, data.test); 0: it makes its own data
    needs: tuple[str, ...] = ()  # the splits whose files training cannot do without
    store: str = ""  # what attnkit prepare encodes into a token store ("parallel files"); "": nothing

    @property
    def default_metric(self) -> str:
        """The ``train.eval_metric`` a run of this task is judged by unless it says otherwise."""
        return next(iter(self.metrics))

    @property
    def files_wanted(self) -> str:
        """What ``data.train`` (or valid, test) must list, in words, for errors."""
        if not self.files:
            return f"no files (data.task={self.name!r} is generated)"
        return "two files [source, target]" if self.files == 2 else "one file [file]"


def _generated_translation(name: str) -> TaskRecord:
    """A translation task whose pairs are generated (data/synthetic.py)."""
    return TaskRecord(
        name, "attnkit.tasks.translation:TranslationTask", _TRANSLATION_ARCHS, _TRANSLATION_METRICS
    )


TASK_RECORDS: dict[str, TaskRecord] = {
    record.name: record
    for record in (
        TaskRecord(
            "parallel", "attnkit.tasks.translation:TranslationTask", _TRANSLATION_ARCHS,
            _TRANSLATION_METRICS, files=2, needs=("train", "valid"), store="parallel files",
        ),
        _generated_translation("dates"),
        _generated_translation("copy"),
        TaskRecord(
            "summarise", "attnkit.tasks.translation:SummarisationTask", _TRANSLATION_ARCHS,
            {"rouge1": "valid_rouge1", "rouge2": "valid_rouge2", "rougeL": "valid_rougeL",
             "loss": "valid_loss"},
            files=1, store="summaries",
        ),
        TaskRecord(
            "text", "attnkit.tasks.language_modelling:LanguageModellingTask", (DecoderModelConfig.ARCH,),
            {"loss": "valid_loss"}, files=1, needs=("train",), store="text",
        ),
        TaskRecord(
            "classify", "attnkit.tasks.classification:ClassificationTask", (EncoderModelConfig.ARCH,),
            {"accuracy": "valid_accuracy", "f1": "valid_f1", "loss": "valid_loss"}, head="classify",
            files=1, needs=("train", "valid"), store="sentences",
        ),
        TaskRecord(
            "mlm", "attnkit.tasks.masked_lm:MaskedLMTask", (EncoderModelConfig.ARCH,),
            {"loss": "valid_loss", "accuracy": "valid_accuracy"}, head="mlm", files=1, needs=("train",),
            store="sentences",
        ),
        TaskRecord(
            "qa", "attnkit.tasks.span_qa:SpanQATask", (EncoderModelConfig.ARCH,),
            {"f1": "valid_f1", "accuracy": "valid_exact", "loss": "valid_loss"}, head="span",
        ),
        TaskRecord(
            "cluttered-digits", "attnkit.tasks.image_classification:ImageClassificationTask",
            (GlimpseConfig.ARCH, WholeImageConfig.ARCH), {"accuracy": "valid_accuracy", "loss": "valid_loss"},
        ),
        TaskRecord(
            "captions", "attnkit.tasks.captioning:CaptioningTask",
            (CaptionerConfig.ARCH, CaptionTransformerConfig.ARCH),
            {"accuracy": "valid_accuracy", "bleu": "valid_bleu", "loss": "valid_loss"},
        ),
        TaskRecord(
            "speech", "attnkit.tasks.speech:SpeechTask", (ListenAttendSpellConfig.ARCH,),
            {"cer": "valid_cer", "wer": "valid_wer", "loss": "valid_loss"}, files=1,
        ),
    )
}  # fmt: skip


def task_record(name: str) -> TaskRecord:
    """The record of ``data.task=name``; an unknown name is a one-line error listing the known ones."""
    require_one_of("data.task", name, tuple(TASK_RECORDS))
    return TASK_RECORDS[name]


def tasks_training(arch: str) -> tuple[str, ...]:
    """The tasks that train a ``model.arch=arch`` model (one: a run's default task for it)."""
    return tuple(record.name for record in TASK_RECORDS.values() if arch in record.trains)


def encoder_heads() -> tuple[str, ...]:
    """The heads an encoder is trained with, one per encoder task."""
    return tuple(record.head for record in TASK_RECORDS.values() if record.head is not None)
