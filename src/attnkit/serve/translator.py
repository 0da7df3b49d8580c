"""A translation or summarisation model as the server runs it: loaded once, searched as the CLI searches.

``run`` is what the batcher calls on its workers: the same ``translate`` that ``attnkit
translate`` uses, with the run's decoding settings (changed by ``decode.field=value`` as on the command
line), so that an input gets the output the CLI gives it with the same beam. With continuous batching,
a greedy request (a beam of one) searched alone in its running batch checks drafts
(``decode.speculative``: the source's tokens, the model's draft decoder, another checkpoint's model;
decode/continuous.py): the same translation and score, sooner.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from attnkit.cpu.compiled.build import CHECK_STEP, FIRST_STEP, compilable, missing_compiler
from attnkit.cpu.compiled.steps import all_built
from attnkit.decode.continuous import RunningTranslations
from attnkit.decode.search import BeamSettings, Search, Translation
from attnkit.decode.starts import EAGER_COST, source_decoding
from attnkit.decode.translate import translate
from attnkit.models import archs
from attnkit.serve.served import CHECKPOINT_DRAFTS, AttnkitModel, MadeAgain
from attnkit.tasks import task_of


@dataclass
class ServedTranslator(AttnkitModel[BeamSettings]):
    dialects: ClassVar[tuple[str, ...]] = ("opennmt",)
    steps_continuously: ClassVar[bool] = True
    drafts: ClassVar[tuple[str, ...]] = ("source", "shallow", CHECKPOINT_DRAFTS)

    @classmethod
    def architectures(cls) -> tuple[str, ...]:
        return archs(using="translate")

    @property
    def beam_size(self) -> int:
        """The beam of a request that names none: the run's ``decode.beam_size``."""
        return self.config.decode.beam_size

    @functools.cached_property
    def max_source_tokens(self) -> int:
        """The longest input the model reads whole (its positions, less one for ``</s>``; a summariser's
        ``data.max_source_len``): the server refuses a longer one where the CLI would cut it. (Found
        once: every request asks.)"""
        limit = self.model.config.max_len
        if task_of(self.config).cuts_sources:
            limit = min(limit, self.config.data.source_limit)
        return limit - 1

    def positions(self, tokens: list[int], settings: BeamSettings) -> int:
        """A beam's rows for each source, each its source and its output's bound."""
        return Search.of(
            self.config.decode, beam_size=settings.beam, max_output_len=self.model.config.max_len
        ).positions(tokens)

    def run(self, texts: list[str], settings: BeamSettings) -> list[list[Translation]]:
        """Each text's ``n_best`` translations (scored, their tokens counted) by a beam of ``beam`` (1: greedy
        search)."""
        return translate(self.model, self.tokenizer, texts, self.config.decode, n_best=settings.n_best,
                         beam_size=settings.beam)  # fmt: skip

    def warm_up(self) -> None:
        """One sentence before the server says it is ready: compiled decoding steps (``decode.steps``) are
        read from their cache now, or with ``compiled`` built now (about 20 s each for a small model),
        not in the first client's request; with drafts, greedy search's steps that check them too."""
        self.run(["."], BeamSettings(self.beam_size))
        if self.config.decode.speculative != "none" and self.config.decode.steps == "compiled":
            self._drafted_steps()

    def _drafted_steps(self) -> bool:
        """Greedy search's compiled steps with the check of drafts (and the draft decoder's steps),
        built where they are not (``decode.steps=compiled``, or in the build process of ``auto``);
        whether they are had."""
        compiled = dataclasses.replace(self.config.decode, steps="compiled")
        return source_decoding(self.model, compiled, 1, self.device, self.tokenizer.specials,
                               drafted=True).compiled  # fmt: skip

    def steps(self) -> str:
        """``compiled`` once the compiled steps of the run's beam are built (``decode.steps``: ``compiled``,
        or ``auto`` once built; the running batches take them within a second), else ``eager``."""
        if self.device.type != "cpu" or self.config.decode.steps == "eager":
            return "eager"
        return "compiled" if all_built(self.model, [FIRST_STEP, self.beam_size]) else "eager"

    def steps_builder(self, warn: Callable[[str], None]) -> Callable[[], Any] | None:
        """``decode.steps=auto`` on a CPU, some of the compiled steps a request may take not built yet
        (:meth:`_all_steps_built`): what builds them (:meth:`build_compiled_steps`, in a process of its
        own, on this model made again there)."""
        decode = self.config.decode
        if decode.steps != "auto" or self._all_steps_built() or not compilable(self.model):
            return None
        missing = missing_compiler()
        if missing:
            warn(f"decode.steps=auto: {missing}; the model's own steps serve, taking {EAGER_COST}")
            return None
        return MadeAgain(self, then="build_compiled_steps")

    def _all_steps_built(self) -> bool:
        """Whether every compiled step this server's requests take is built: the first step, the run's
        beam's and greedy search's (a request may ask for a beam of one, which one client's latency
        hangs on: with the model's own steps it took twice as long), and with drafts
        (``decode.speculative``) greedy search's check step and the draft decoder's steps."""
        widths = [FIRST_STEP, self.beam_size, 1]
        drafts = self.config.decode.speculative != "none"
        draft = getattr(self.model, "draft", None) if drafts else None
        if drafts:
            widths.append(CHECK_STEP)
        if draft is not None and compilable(draft) and not all_built(draft, [1, CHECK_STEP]):
            return False
        return all_built(self.model, widths)

    def build_compiled_steps(self) -> None:
        """The compiled steps of the run's beam built into the cache, then greedy search's (and with drafts,
        its check step and the draft decoder's): in a process of its own; raises saying why the run's
        beam's could not be built. The running batches take each kind as it is built."""
        notes: list[str] = []
        compiled = dataclasses.replace(self.config.decode, steps="compiled")
        how = source_decoding(self.model, compiled, self.beam_size, self.device, self.tokenizer.specials,
                              notes.append)  # fmt: skip
        if not how.compiled:
            raise RuntimeError(notes[-1] if notes else "the compiled steps could not be built")
        if self.config.decode.speculative != "none":
            self._drafted_steps()  # greedy search's steps with their check (a beam of one's, built here)
        elif self.beam_size != 1:
            source_decoding(self.model, compiled, 1, self.device, self.tokenizer.specials)

    def running_batch(self) -> RunningTranslations:
        """Inputs ``(text, BeamSettings)`` searched as :meth:`run` searches them, in a running batch
        (decode/continuous.py)."""
        return RunningTranslations(self.model, self.tokenizer, self.config.decode, self.device)
