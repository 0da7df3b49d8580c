"""``attnkit serve --engine ctranslate2``: a folder from ``attnkit export --to ctranslate2`` served through
the same endpoints and batcher as a checkpoint, searched by CTranslate2 (decode/ct2.py).

Each batch the batcher forms goes to CTranslate2 as ``attnkit translate --engine ctranslate2`` sends a
file's lines, so a sentence gets the CLI's output with the same settings (decode/ct2.py says where
CTranslate2's search differs from attnkit's). Its int8 is chosen at export (``--quantization int8``).
What this engine cannot do: per-request sampling seeds (CTranslate2 seeds one generator per thread,
once, with ``decode.seed``: a request that names a seed and samples is refused), and the attention
explorer (CTranslate2 gives no attention weights; ``/explore`` answers 404).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from attnkit.checkpoint.ctranslate2_folder import exported_model
from attnkit.config import DecodeConfig
from attnkit.decode.ct2 import CTranslate2Generator, CTranslate2Translator
from attnkit.decode.generate import Listening
from attnkit.decode.search import BeamSettings, Search, Translation
from attnkit.serve.decoder import Prompt, Sampling, SamplingModel
from attnkit.serve.served import ServedModel

DEFAULT_INPUT = 1024  # CTranslate2's own bound on an input (its max_input_length), for older exports


@dataclass
class EngineTranslator(ServedModel[BeamSettings]):
    """A CTranslate2 translation model, answering ``POST /translator/translate`` as
    :class:`ServedTranslator` does."""

    engine_model: CTranslate2Translator

    engine: ClassVar[str] = "ctranslate2"
    dialects: ClassVar[tuple[str, ...]] = ("opennmt",)

    @classmethod
    def load(
        cls, folder: Path, overrides: list[str], warn: Callable[[str], None] | None = None
    ) -> EngineTranslator:
        """The exported translator in ``folder`` ready to serve; ``warn`` hears of a decoding setting
        CTranslate2 cannot follow."""
        if not any(o.startswith("decode.streams=") for o in overrides):
            # one CTranslate2 worker on every thread unless asked: a server's single requests then take
            # the whole CPU, and are answered sooner, for a little less throughput under many clients
            # (bench/serve_load.py, docs/benchmarks.md); batches side by side are decode.streams=2
            overrides = [*overrides, "decode.streams=1"]
        translator = CTranslate2Translator(folder, overrides, warn)
        return cls(folder, translator.tokenizer, translator)

    @property
    def beam_size(self) -> int:
        return self.engine_model.decode.beam_size

    @property
    def streams(self) -> int:
        """CTranslate2's ``inter_threads`` (``decode.streams``): batches it runs at a time."""
        return self.engine_model.streams

    @property
    def max_source_tokens(self) -> int:
        """The model's positions less one for ``</s>``, as for attnkit's engine."""
        return (self.engine_model.context or DEFAULT_INPUT) - 1

    def describe(self) -> dict[str, Any]:
        return _described(self.checkpoint, self.engine_model.decode)

    def positions(self, tokens: list[int], settings: BeamSettings) -> int:
        """A beam's rows for each source, each its source and its output's bound."""
        search = Search.of(
            self.engine_model.decode, beam_size=settings.beam, max_output_len=self.max_source_tokens + 1
        )
        return search.positions(tokens)

    def run(self, texts: list[str], settings: BeamSettings) -> list[list[Translation]]:
        return self.engine_model.translate_n_best(texts, settings.n_best, beam_size=settings.beam)


@dataclass
class EngineDecoder(SamplingModel):
    """A CTranslate2 decoder (GPT-style), answering the generation endpoints as :class:`ServedDecoder`.
    Streaming prompts are generated one at a time (CTranslate2 streams one sequence), the others of a
    batch together."""

    engine_model: CTranslate2Generator
    loaded_decode: DecodeConfig  # the folder's settings; each batch runs with its requests' changes

    engine: ClassVar[str] = "ctranslate2"
    seeds_per_request: ClassVar[bool] = False

    @classmethod
    def load(
        cls, folder: Path, overrides: list[str], warn: Callable[[str], None] | None = None
    ) -> EngineDecoder:
        """The exported decoder in ``folder`` ready to serve (it follows every decoding setting)."""
        generator = CTranslate2Generator(folder, overrides)
        return cls(folder, generator.tokenizer, generator, generator.decode)

    @property
    def decode(self) -> DecodeConfig:
        return self.loaded_decode

    @property
    def streams(self) -> int:
        return 1  # each batch's settings are set on the one CTranslate2 generator before it runs

    @property
    def context(self) -> int:
        return self.engine_model.context or DEFAULT_INPUT

    def describe(self) -> dict[str, Any]:
        return _described(self.checkpoint, self.loaded_decode)

    def run(self, prompts: list[Prompt], settings: Sampling) -> list[str]:
        self.engine_model.decode = self.decode_for(settings)
        outputs = [""] * len(prompts)
        whole = [i for i, prompt in enumerate(prompts) if prompt.sink is None]
        if whole:
            for i, text in zip(
                whole, self.engine_model.generate([prompts[i].text for i in whole]), strict=True
            ):
                outputs[i] = text
        for i, prompt in enumerate(prompts):
            if prompt.sink is not None and not prompt.gone.is_set():
                listening = Listening(_to(prompt.sink), lambda index, gone=prompt.gone: not gone.is_set())
                (outputs[i],) = self.engine_model.generate([prompt.text], listening)
        return outputs


def _to(sink: Callable[[str], None]) -> Callable[[int, str], None]:
    """A streaming prompt's sink, as decode/ct2.py's ``on_text(index, text)``."""
    return lambda index, text: sink(text)


def _described(folder: Path, decode: DecodeConfig) -> dict[str, Any]:
    held = exported_model(folder)
    return {"engine": "ctranslate2", "arch": held["arch"], "context": held.get("context"),
            "config": {"decode": dataclasses.asdict(decode)}}  # fmt: skip
