"""The independent reference for a search's greedy output: one full teacher-forced forward pass per
token, the argmax of the last position taken each time (never ``<pad>`` or ``<s>``), stopping at
``</s>`` or after ``limit - 1`` tokens (the bound holds ``</s>``)."""

import torch

from attnkit.data.tokenizer import Tokenizer


def greedy_by_full_passes(
    model: torch.nn.Module, inputs: torch.Tensor, tokenizer: Tokenizer, limit: int
) -> str:
    """What greedy search should write for ``inputs`` (one row: an image, an utterance's frames)."""
    specials = tokenizer.specials
    tokens = [specials.bos]
    for _ in range(limit - 1):
        with torch.no_grad():
            logits = model(inputs, torch.tensor([tokens]))[0, -1]
        logits[specials.pad] = logits[specials.bos] = float("-inf")  # never predicted
        tokens.append(int(logits.argmax()))
        if tokens[-1] == specials.eos:
            break
    return tokenizer.decode([t for t in tokens[1:] if t != specials.eos])
