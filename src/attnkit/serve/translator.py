"""A translation or summarisation model as the server runs it: loaded once, searched as the CLI searches.

``run`` is what the batcher calls on its workers: the same ``translate`` that ``attnkit
translate`` uses, with the run's decoding settings (changed by ``decode.field=value`` as on the command
line), so that an input gets the output the CLI gives it with the same beam.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from attnkit.decode.continuous import RunningTranslations
from attnkit.decode.search import BeamSettings, Search
from attnkit.decode.translate import translate
from attnkit.models import archs
from attnkit.serve.served import AttnkitModel
from attnkit.tasks import task_of


@dataclass
class ServedTranslator(AttnkitModel[BeamSettings]):
    dialects: ClassVar[tuple[str, ...]] = ("opennmt",)
    steps_continuously: ClassVar[bool] = True

    @classmethod
    def architectures(cls) -> tuple[str, ...]:
        return archs(using="translate")

    @property
    def beam_size(self) -> int:
        """The beam of a request that names none: the run's ``decode.beam_size``."""
        return self.config.decode.beam_size

    @property
    def max_source_tokens(self) -> int:
        """The longest input the model reads whole (its positions, less one for ``</s>``; a summariser's
        ``data.max_source_len``): the server refuses a longer one where the CLI would cut it."""
        limit = self.model.config.max_len
        if task_of(self.config).cuts_sources:
            limit = min(limit, self.config.data.source_limit)
        return limit - 1

    def positions(self, tokens: list[int], settings: BeamSettings) -> int:
        """A beam's rows for each source, each its source and its output's bound."""
        return Search.of(
            self.config.decode, beam_size=settings.beam, max_output_len=self.model.config.max_len
        ).positions(tokens)

    def run(self, texts: list[str], settings: BeamSettings) -> list[list[tuple[str, float]]]:
        """Each text's ``n_best`` translations and scores by a beam of ``beam`` (1: greedy search)."""
        return translate(self.model, self.tokenizer, texts, self.config.decode, n_best=settings.n_best,
                         beam_size=settings.beam)  # fmt: skip

    def warm_up(self) -> None:
        """One sentence before the server says it is ready: a compiled decoding step (decode.compile) is
        built (or read from its cache) now, not in the first client's request (about 20 s for a small
        model)."""
        self.run(["."], BeamSettings(self.beam_size))

    def running_batch(self) -> RunningTranslations:
        """Inputs ``(text, BeamSettings)`` searched as :meth:`run` searches them, in a running batch
        (decode/continuous.py)."""
        return RunningTranslations(self.model, self.tokenizer, self.config.decode, self.device)
