"""A BERT-style encoder-only Transformer (Devlin et al., 2019) and its three heads, read top to bottom.

Each token's embedding, its position's and its segment's (token type: sentence A or B) are summed, the
sum layer-normalised and dropped out; N layers of bidirectional self-attention and feed-forward follow:
the paper's encoder layer, post-LN, with GELU. Then a head (``model.head``):

- ``mlm``: masked-language-model logits: dense, GELU, LayerNorm, then the token embedding itself
  (transposed) plus a bias; BERT §3.1, task 1.
- ``classify``: BERT's pooler ``tanh(W h_[CLS] + b)`` (or the mean of the real tokens' states), dropout
  and a linear map to ``num_labels`` logits; BERT §4.1.
- ``span``: a start and an end logit for every token, for extractive question answering; BERT §4.2.
- ``none``: the last hidden states, e.g. for sentence embeddings (all-MiniLM-L6-v2 mean-pools them).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.models.config import EncoderModelConfig
from attnkit.models.layers import encoder_layer
from attnkit.nn.embedding import Embeddings, positional_encoding
from attnkit.nn.feedforward import ACTIVATIONS
from attnkit.nn.transformer import Encoder


class EncoderEmbeddings(nn.Module):
    """``LayerNorm(token + position + segment)`` and dropout: ``(B, T) -> (B, T, d_model)``."""

    def __init__(self, c: EncoderModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.words = Embeddings(vocab_size, c.d_model, padding_idx=c.pad_id, scale=False)
        self.positions = positional_encoding(c.positions, c.d_model, 0.0, c.max_len, c.sinusoid_layout)
        self.token_types = nn.Embedding(c.type_vocab_size, c.d_model) if c.type_vocab_size else None
        self.norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, ids: Tensor, token_types: Tensor | None = None) -> Tensor:
        x = self.positions(self.words(ids))
        if self.token_types is not None:
            x = x + self.token_types(torch.zeros_like(ids) if token_types is None else token_types)
        return self.dropout(self.norm(x))


class MaskedLMHead(nn.Module):
    """Logits over the vocabulary for every position: ``(B, T, d_model) -> (B, T, V)``."""

    def __init__(self, c: EncoderModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.transform = nn.Linear(c.d_model, c.d_model)
        self.activation = ACTIVATIONS[c.activation]
        self.norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.proj = nn.Linear(c.d_model, vocab_size)  # its weight is the token embedding (tied below)

    def forward(self, hidden: Tensor, valid: Tensor) -> Tensor:
        return self.proj(self.norm(self.activation(self.transform(hidden))))


class ClassificationHead(nn.Module):
    """Class logits for each sequence: ``(B, T, d_model) -> (B, num_labels)``."""

    def __init__(self, c: EncoderModelConfig) -> None:
        super().__init__()
        self.pooling = c.pooling
        self.pooler = nn.Linear(c.d_model, c.d_model) if c.pooling == "cls" else None
        self.dropout = nn.Dropout(c.dropout)
        self.classifier = nn.Linear(c.d_model, c.num_labels)

    def forward(self, hidden: Tensor, valid: Tensor) -> Tensor:
        if self.pooler is not None:  # BERT's pooler reads the [CLS] position
            pooled = torch.tanh(self.pooler(hidden[:, 0]))
        else:  # the mean of the real tokens' states
            pooled = (hidden * valid.unsqueeze(-1)).sum(1) / valid.sum(1, keepdim=True).clamp(min=1)
        return self.classifier(self.dropout(pooled))


class SpanHead(nn.Module):
    """A start and an end logit per token: ``(B, T, d_model) -> ((B, T), (B, T))``."""

    def __init__(self, c: EncoderModelConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(c.d_model, 2)

    def forward(self, hidden: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        start, end = self.proj(hidden).unbind(-1)
        return start, end


class EncoderModel(nn.Module):
    """BERT: ``forward(ids, token_types)`` gives the head's output; ``encode`` the hidden states."""

    def __init__(self, config: EncoderModelConfig, vocab_size: int) -> None:
        super().__init__()
        c = config
        self.config, self.vocab_size = c, vocab_size
        self.embed = EncoderEmbeddings(c, vocab_size)

        self.encoder = Encoder(
            [encoder_layer(c) for _ in range(c.layers)], c.d_model, c.norm_first, c.layer_norm_eps
        )
        heads = {"none": lambda: None, "mlm": lambda: MaskedLMHead(c, vocab_size),
                 "classify": lambda: ClassificationHead(c), "span": lambda: SpanHead(c)}  # fmt: skip
        self.head = heads[c.head]()
        self._init_weights()

    def _init_weights(self) -> None:
        """BERT's initialisation: N(0, 0.02) weights and embeddings, zero biases, unit LayerNorms; the
        masked-LM head's output is the token embedding."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if isinstance(self.head, MaskedLMHead):
            self.head.proj.weight = self.embed.words.lut.weight

    def encode(self, ids: Tensor, token_types: Tensor | None = None, valid: Tensor | None = None) -> Tensor:
        """Hidden states ``(B, T, d_model)``; ``valid (B, T)`` marks real tokens (default: not padding)."""
        valid = ids != self.config.pad_id if valid is None else valid
        return self.encoder(self.embed(ids, token_types), valid.unsqueeze(-2), valid=valid)  # mask (B, 1, T)

    def forward(
        self,
        ids: Tensor,
        token_types: Tensor | None = None,
        valid: Tensor | None = None,
        select: Tensor | None = None,
    ):
        """The head's output for ``ids (B, T)`` (the hidden states when there is no head). ``select
        (B, T)``, for the masked-LM head, asks for the logits of the selected positions only, ``(n, V)``:
        masked-LM training predicts ~15% of the tokens, and the vocabulary projection of the others
        would be most of the work."""
        valid = ids != self.config.pad_id if valid is None else valid
        hidden = self.encode(ids, token_types, valid)
        if self.head is None:
            return hidden
        if select is not None:
            if not isinstance(self.head, MaskedLMHead):
                raise ValueError("select= is for the masked-LM head")
            return self.head(hidden[select], valid[select])  # (n, d_model) -> (n, V)
        return self.head(hidden, valid)
