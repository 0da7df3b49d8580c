"""A decoder model (GPT) as the server runs it: prompts continued as ``attnkit generate`` continues them.

Each request brings its own sampling settings; requests with equal settings share a batch, and each
prompt samples from its own generator seeded with its request's seed (``decode.seed`` by default, the
seed ``attnkit generate`` gives its first prompt), so a prompt's continuation does not depend on the
batch it lands in. A streaming request's prompt carries a ``sink`` that hears its text piece by piece
as the batch generates it; the others in the same batch are answered at the end. A prompt whose client
has gone (``abandon``) stops being extended at the next step, whatever else its batch holds.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from attnkit.config import DecodeConfig
from attnkit.decode.continuous import RunningGenerations
from attnkit.decode.generate import Listening, generate
from attnkit.models import archs
from attnkit.serve.served import CHECKPOINT_DRAFTS, AttnkitModel, ServedModel


@dataclass(frozen=True)
class Sampling:
    """A request's generation settings (those of ``DecodeConfig``): requests with equal ones share a
    batch."""

    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    stop: tuple[str, ...]


@dataclass
class Prompt:
    text: str
    seed: int
    sink: Callable[[str], None] | None = None  # a streaming request's: hears each new piece of text
    gone: threading.Event = field(default_factory=threading.Event)  # set once nobody waits for it


class SamplingModel(ServedModel[Sampling]):
    """A served decoder of either engine: the run's decoding settings, changed per request; the
    endpoints of TGI's and OpenAI's dialects."""

    dialects: ClassVar[tuple[str, ...]] = ("tgi", "openai")
    seeds_per_request: ClassVar[bool] = True  # whether a request's seed decides its sample

    @property
    def decode(self) -> DecodeConfig:
        """The run's decoding settings (``decode.field=value`` arguments applied)."""
        raise NotImplementedError

    @property
    def context(self) -> int:
        """Positions for prompt and continuation together."""
        raise NotImplementedError

    def sampling(self, **given: object) -> Sampling:
        """A request's settings: what it gives, the run's ``decode`` section for the rest (checked as a
        config file's are)."""
        chosen = {k: v for k, v in given.items() if v is not None}
        decode = dataclasses.replace(self.decode, **chosen)  # DecodeConfig checks the values
        return Sampling(
            decode.max_new_tokens, decode.temperature, decode.top_k, decode.top_p, tuple(decode.stop)
        )

    def positions(self, tokens: list[int], settings: Sampling) -> int:
        """A row for each prompt, its prompt and as many new tokens as it may have (within the context)."""
        new = settings.max_new_tokens
        return sum(min(n + new, self.context) for n in tokens)

    def abandon(self, inputs: list[Prompt]) -> None:
        """The client of these prompts has gone: their generation stops at its next step."""
        for prompt in inputs:
            prompt.gone.set()

    def decode_for(self, sampling: Sampling) -> DecodeConfig:
        """The run's decoding settings with a request's sampling settings; a sampled request checks no
        drafts (speculative sampling draws from the model's distribution, but not the text plain
        sampling draws with the same seed: a request's answer would depend on whether it ran alone)."""
        changed = {**dataclasses.asdict(sampling), "stop": list(sampling.stop)}
        if sampling.temperature:
            changed["speculative"] = "none"
        return dataclasses.replace(self.decode, **changed)


@dataclass
class ServedDecoder(SamplingModel, AttnkitModel[Sampling]):
    """A decoder checkpoint run by attnkit itself: a greedy request continued alone checks drafts
    (``decode.speculative``: copied from its prompt and text so far, or guessed by the checkpoint's
    draft decoder or another checkpoint's model; decode/continuous.py), for the same text sooner."""

    drafts: ClassVar[tuple[str, ...]] = ("source", "shallow", CHECKPOINT_DRAFTS)

    @classmethod
    def architectures(cls) -> tuple[str, ...]:
        return archs(using="generate")

    @property
    def decode(self) -> DecodeConfig:
        return self.config.decode

    @property
    def context(self) -> int:
        return self.model.config.max_len

    def run(self, prompts: list[Prompt], settings: Sampling) -> list[str]:
        """Each prompt's continuation; streaming prompts hear theirs as it grows."""
        decode = self.decode_for(settings)

        def on_text(i: int, text: str) -> None:
            if prompts[i].sink is not None:
                prompts[i].sink(text)

        streaming = any(prompt.sink is not None for prompt in prompts)
        listening = Listening(on_text if streaming else None, lambda i: not prompts[i].gone.is_set())
        return generate(self.model, self.tokenizer, [p.text for p in prompts], decode, listening=listening,
                        seeds=[p.seed for p in prompts])  # fmt: skip

    steps_continuously: ClassVar[bool] = True

    def running_batch(self) -> RunningGenerations:
        """Prompts continued as :meth:`run` continues them, in a running batch (decode/continuous.py)."""
        return RunningGenerations(self.model, self.tokenizer, self.decode_for, self.device)
