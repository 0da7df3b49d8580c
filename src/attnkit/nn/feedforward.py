"""Position-wise feed-forward network (Vaswani et al., 2017, §3.3, eq. 2).

``FFN(x) = max(0, x W_1 + b_1) W_2 + b_2``: two linear maps with a ReLU between, applied to each
position separately. GELU (Hendrycks & Gimpel, 2016; BERT) is an option, and so is its tanh
approximation, which GPT-2 uses (HF calls it "gelu_new").
"""

from __future__ import annotations

import functools

import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh")}


class PositionwiseFeedForward(nn.Module):
    """``(B, T, d_model) -> (B, T, d_ff) -> (B, T, d_model)``.

    ``dropout`` acts on the hidden activations; the paper has none there (its default here is 0), while
    the Annotated Transformer and ``torch.nn.Transformer`` use the residual dropout rate.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.activation = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.dropout(self.activation(self.w_1(x))))
