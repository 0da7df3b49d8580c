"""The request bodies the endpoints accept, with the bounds each field is checked against.

pydantic checks a body before any endpoint sees it: a field of the wrong type, out of range or over a
bound is a 422 naming the field (``parameters.seed: Input should be less than ...``), so no value that
the model cannot take reaches it as a 500. Text fields must be whole Unicode text: JSON can carry a lone
surrogate (``"\\ud800"``), which no tokenizer can encode.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

MAX_STOP_STRINGS = 16  # stop strings in one request
MAX_STOP_CHARS = 256  # characters in one stop string
MAX_TEMPERATURE = 100.0  # past this, sampling is as good as uniform (and float32 logits overflow at 1e38)
MAX_SEED = 2**63 - 1  # a generator's seed is a signed 64-bit number


def _whole_text(text: str) -> str:
    """``text``, unless it holds a lone surrogate (half of a UTF-16 pair: no character, no UTF-8)."""
    for i, character in enumerate(text):
        if "\ud800" <= character <= "\udfff":
            raise ValueError(f"character {i} is a lone surrogate (U+{ord(character):04X}), not text")
    return text


Text = Annotated[str, AfterValidator(_whole_text)]
StopString = Annotated[Text, Field(min_length=1, max_length=MAX_STOP_CHARS)]
StopStrings = Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]
Temperature = Annotated[float, Field(ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]


class TranslateItem(BaseModel):
    """One input of OpenNMT-py's request format."""

    src: Text
    id: int = 100
    beam_size: int | None = Field(default=None, ge=1, le=64)
    n_best: int = Field(default=1, ge=1, le=64)


class PredictBody(BaseModel):
    """``{"inputs": [...]}``: sentences (a classifier; a masked-LM's with its mask token), or
    ``question<TAB>passage`` (question answering), as ``attnkit predict`` reads them."""

    inputs: list[Text] = Field(min_length=1)


class Parameters(BaseModel):
    """TGI's ``parameters``: a request's generation settings (the run's ``decode`` ones where unset)."""

    max_new_tokens: int | None = Field(default=None, ge=1)
    temperature: Temperature | None = None
    top_k: int | None = Field(default=None, ge=0)
    top_p: TopP | None = None
    stop: StopStrings | None = None
    seed: Seed | None = None


class GenerateBody(BaseModel):
    """TGI's ``/generate`` and ``/generate_stream`` body."""

    inputs: Text
    parameters: Parameters = Parameters()


class CompletionBody(BaseModel):
    """OpenAI's ``/v1/completions`` body."""

    prompt: Text | list[Text]
    model: str = ""
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop: StopString | StopStrings | None = None
    seed: Seed | None = None
    stream: bool = False
