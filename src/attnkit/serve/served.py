"""What every model the server runs has: a checkpoint loaded once, with its tokenizer and run config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from attnkit.config import RunConfig
from attnkit.data.tokenizer import Tokenizer


@dataclass
class ServedModel:
    checkpoint: Path  # the folder it was loaded from (GET /info says it)
    model: torch.nn.Module
    tokenizer: Tokenizer
    config: RunConfig
    device: torch.device

    def tokens(self, texts: list[str]) -> list[int]:
        """How many tokens each text is (for the length limits and the batches' token budget)."""
        return [len(ids) for ids in self.tokenizer.encode_batch(texts)]
