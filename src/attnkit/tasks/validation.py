"""What every task's validation reports first: the loss and perplexity per predicted token."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from attnkit.metrics import perplexity


def validation_loss(
    loss: Callable[[torch.nn.Module, Any], tuple[Tensor, Tensor]],
    model: torch.nn.Module,
    batches: Iterable[Any],
    device: torch.device,
    autocast: Callable,
) -> dict[str, float]:
    """``valid_loss`` and ``valid_ppl`` over ``batches`` (each with ``.to(device)`` and ``n_tokens``):
    the task's ``loss`` summed on the device and read once at the end, not once per batch."""
    sums, tokens = torch.zeros(2, device=device), 0  # (loss, nll)
    for batch in batches:
        batch = batch.to(device)
        with autocast():
            sums += torch.stack(loss(model, batch))
        tokens += batch.n_tokens
    loss_sum, nll_sum = sums.tolist()
    return {"valid_loss": loss_sum / tokens, "valid_ppl": perplexity(nll_sum / tokens)}
