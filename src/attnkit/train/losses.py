"""Label-smoothed cross-entropy (Szegedy et al., 2016; the paper's §5.4 with ε_ls = 0.1).

The paper notes that smoothing "hurts perplexity, as the model learns to be more unsure, but improves
accuracy and BLEU". The smoothed target distribution is the Annotated Transformer's ``LabelSmoothing``:
``1 - ε`` on the reference token, ``ε / (V - 2)`` on every other token except ``<pad>``, which gets none
(``<pad>`` is never a prediction), and padded positions count nothing. PyTorch's
``cross_entropy(label_smoothing=ε)`` differs: it spreads ``ε / V`` over all ``V`` tokens, ``<pad>``
included.

We return the cross-entropy with that distribution, ``-Σ_j p_j log q_j``, the quantity fairseq reports.
The Annotated Transformer's ``KLDivLoss`` is the same minus the distribution's entropy, a constant: the
gradients are identical. The plain negative log-likelihood is returned too, for perplexity.
"""

from __future__ import annotations

import torch
from torch import Tensor


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and NLL over non-pad targets: logits ``(B, T, V)``, target ``(B, T)``."""
    smoothed, nll = token_losses(logits, target, epsilon, pad_id)
    return smoothed.sum(), nll.sum()


def token_losses(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Each target token's smoothed loss and (detached) NLL, ``(B, T)`` each, zero at padding.

    One log-softmax, in float32 at least whatever the logits' dtype (bf16 logits are not copied to
    float32 first: the kernel reads them and writes float32).
    """
    V = logits.size(-1)
    log_q = logits.log_softmax(-1, dtype=torch.promote_types(logits.dtype, torch.float32))  # (B, T, V)
    keep = target != pad_id  # (B, T)
    safe_target = target.masked_fill(~keep, 0).unsqueeze(-1)  # pad positions are zeroed below anyway
    log_q_ref = log_q.gather(-1, safe_target).squeeze(-1)  # (B, T)
    log_q_others = log_q.sum(-1) - log_q_ref - log_q[..., pad_id]  # Σ over j ∉ {reference, <pad>}
    smoothed = -(1.0 - epsilon) * log_q_ref - epsilon / (V - 2) * log_q_others
    nll = -log_q_ref.detach()
    zero = log_q.new_zeros(())
    return torch.where(keep, smoothed, zero), torch.where(keep, nll, zero)
