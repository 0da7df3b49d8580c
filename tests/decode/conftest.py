"""What the decoding tests share: a tiny decoder that continues text plausibly but not exactly."""

import pytest
import torch

from attnkit.data.tokenizer import Tokenizer
from attnkit.models import build_model, from_preset

TEXT = ["to be or not to be, that is the question", "all the world's a stage", "now is the winter"]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    """A tiny model trained for a moment on TEXT, so that it continues text plausibly but not exactly."""
    tokenizer = Tokenizer.train("char", TEXT)
    torch.manual_seed(0)
    model = build_model(from_preset("tiny-decoder", max_len=48), tokenizer.vocab_size)
    stream = torch.tensor(tokenizer.encode(" / ".join(TEXT * 3)))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        starts = torch.randint(0, len(stream) - 33, (16,))
        block = torch.stack([stream[s : s + 33] for s in starts])  # (16, 33)
        loss = torch.nn.functional.cross_entropy(model(block[:, :-1]).transpose(1, 2), block[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), tokenizer
