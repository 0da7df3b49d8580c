"""The residual connection around every sub-layer (Vaswani et al., 2017, §3.1 and §5.4).

The paper computes ``LayerNorm(x + nn.Dropout(Sublayer(x)))`` ("post-LN"). The Annotated Transformer
computes ``x + nn.Dropout(Sublayer(LayerNorm(x)))`` ("pre-LN", Xiong et al., 2020) while citing the paper;
here post-LN is the default and pre-LN an explicit option. A pre-LN stack needs one more LayerNorm after
its last layer, which Encoder and Decoder add.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn


class SublayerConnection(nn.Module):
    """Residual connection, dropout and layer normalisation around one sub-layer."""

    def __init__(
        self, d_model: int, dropout: float = 0.0, norm_first: bool = False, eps: float = 1e-5
    ) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))
