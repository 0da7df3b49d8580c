"""An encoder model as the server runs it: its task's ``infer``, as ``attnkit predict`` runs it, with
each printed line given back as JSON.

A classifier answers ``{"label", "probability"}``; a question-answering model ``{"answer"}``; a
masked-LM model ``{"masks": [{"token", "probability"}, ...]}``, one per mask of the sentence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from attnkit.loading import check_head
from attnkit.models import archs
from attnkit.serve.served import AttnkitModel
from attnkit.tasks import task_of

HEADS = ("classify", "span", "mlm")  # the encoder heads attnkit predict runs


@dataclass
class ServedPredictor(AttnkitModel[None]):
    """An encoder checkpoint with a classification, question-answering or masked-LM head, which reads no
    decode settings but its precision (``decode.precision=bf16``)."""

    dialects: ClassVar[tuple[str, ...]] = ("predict",)
    decodes: ClassVar[bool] = False

    @classmethod
    def architectures(cls) -> tuple[str, ...]:
        return archs(using="predict", reading="text")

    def warm_up(self) -> None:
        """A one-line error for a head ``attnkit predict`` does not run."""
        check_head(self.checkpoint, self.config, HEADS)

    @property
    def head(self) -> str:
        return self.config.model.head

    @property
    def max_tokens(self) -> int:
        """The longest input the model reads whole: its positions, less ``[CLS]`` and ``[SEP]``."""
        return self.model.config.max_len - 2

    def problem(self, inputs: list[str]) -> str | None:
        """Why ``inputs`` cannot be answered (naming the first bad one), or None."""
        for i, text in enumerate(inputs):
            if self.head == "span" and "\t" not in text:
                return f"inputs.{i}: no tab; a question-answering input is question<TAB>passage"
            if self.head == "mlm":
                written = self.tokenizer.hf.id_to_token(self.tokenizer.specials.mask)
                if written not in text:
                    return f"inputs.{i}: no {written} to fill"
        return None

    def run(self, inputs: list[str], settings: None) -> list[str]:
        """What ``attnkit predict`` prints for each input."""
        return task_of(self.config).infer(self.model, self.tokenizer, self.config, inputs, self.device)

    def as_json(self, line: str) -> dict:
        """One printed line as JSON (see the module docstring)."""
        if self.head == "span":
            return {"answer": line}
        fields = line.split("\t")  # token, probability, token, probability, ...
        pairs = [
            {"token": token, "probability": float(p)}
            for token, p in zip(fields[::2], fields[1::2], strict=True)
        ]
        if self.head == "mlm":
            return {"masks": pairs}
        return {"label": pairs[0]["token"], "probability": pairs[0]["probability"]}
