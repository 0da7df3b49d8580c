"""Label-smoothed cross-entropy (Szegedy et al., 2016; the paper's §5.4 with ε_ls = 0.1).

The paper notes that smoothing "hurts perplexity, as the model learns to be more unsure, but improves
accuracy and BLEU". We compute PyTorch's fused ``cross_entropy(label_smoothing=ε)``, which puts ``1 - ε``
on the reference token plus ``ε / V`` on every token, and ignores padding. The plain NLL is returned
too, for perplexity.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from attnkit.data.tokenizer import PAD_ID


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and NLL over non-pad tokens: logits ``(B, T, V)``, target ``(B, T)``."""
    flat_logits, flat_target = logits.flatten(0, 1).float(), target.flatten()
    loss = F.cross_entropy(
        flat_logits, flat_target, ignore_index=PAD_ID, label_smoothing=epsilon, reduction="sum"
    )
    nll = F.cross_entropy(flat_logits.detach(), flat_target, ignore_index=PAD_ID, reduction="sum")
    return loss, nll
