"""The request bodies the endpoints accept, with the bounds each field is checked against.

pydantic checks a body before any endpoint sees it: a field of the wrong type, out of range or over a
bound is a 422 naming the field (``parameters.seed: Input should be less than ...``), so no value that
the model cannot take reaches it as a 500. Text fields must be whole Unicode text: JSON can carry a lone
surrogate (``"\\ud800"``), which no tokenizer can encode.

The hot endpoint (``/translator/translate``) reads its body itself (:func:`parsed`) with the same checks
and errors: FastAPI's parsing of the body and its encoding of the answer took an eighth of the app's
CPU per request (its routing to the handler took a third: serve/middleware.py, ``Direct``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, Field, TypeAdapter, ValidationError

from attnkit.serve.errors import MALFORMED_JSON, NOT_JSON, RequestError, invalid_body

MAX_STOP_STRINGS = 16  # stop strings in one request
MAX_STOP_CHARS = 256  # characters in one stop string
MAX_TEMPERATURE = 100.0  # past this, sampling is as good as uniform (and float32 logits overflow at 1e38)
MAX_SEED = 2**63 - 1  # a generator's seed is a signed 64-bit number
Body = TypeVar("Body")


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


TranslateItems = TypeAdapter(list[TranslateItem])


def parsed(body: bytes, adapter: TypeAdapter[Body]) -> Body:
    """A request's ``body`` checked as ``adapter``'s type, the errors FastAPI's own checks give: 400 for
    what is not JSON in UTF-8 (or nests past Python's recursion limit), 422 naming the first field
    that is wrong. (The standard library parses it, as FastAPI does: pydantic's own JSON parser
    refuses a lone surrogate as bad JSON, where the check of :data:`Text` names the field.)"""
    try:
        data: Any = json.loads(body)
    except json.JSONDecodeError:
        raise RequestError(400, "malformed_json", NOT_JSON) from None
    except (UnicodeDecodeError, RecursionError):
        raise RequestError(400, "malformed_json", MALFORMED_JSON) from None
    try:
        return adapter.validate_python(data)
    except ValidationError as error:
        raise invalid_body(error.errors()) from None
