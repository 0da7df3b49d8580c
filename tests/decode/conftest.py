"""What the decoding tests share: a tiny decoder that continues text plausibly but not exactly."""

import pytest
import torch

from attnkit.data.tokenizer import Tokenizer
from attnkit.models import build_model, from_preset
from tests.decode.drafting import trained_on

TEXT = ["to be or not to be, that is the question", "all the world's a stage", "now is the winter"]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    """A tiny model trained for a moment on TEXT, so that it continues text plausibly but not exactly."""
    tokenizer = Tokenizer.train("char", TEXT)
    torch.manual_seed(0)
    model = build_model(from_preset("tiny-decoder", max_len=48), tokenizer.vocab_size)
    return trained_on(model, tokenizer, " / ".join(TEXT * 3), 150, 3e-3), tokenizer
