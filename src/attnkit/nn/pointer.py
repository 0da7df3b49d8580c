"""Copying from the source: the pointer-generator's output distribution (See, Liu & Manning, 2017, §2.2).

A summary reuses the source's words (names, dates, the topic), which a model that must generate every
word from the vocabulary learns slowly. The pointer-generator lets the decoder point at source tokens:
its state ``h_t`` attends once more to the encoder's memory (one head, the scaled dot product of
``attend``) for a distribution ``α_t`` over source positions and a context ``c_t = Σ_j α_tj m_j``, and a
switch ``p_gen = σ(w·[h_t; c_t] + b)`` mixes generating and copying (their eq. 8-9)::

    P(w) = p_gen · P_vocab(w) + (1 - p_gen) · Σ_{j: x_j = w} α_tj

attnkit's summarisation shares one vocabulary between source and target (byte-level BPE: no word is
out of it), so every source token already has its output id and no extended vocabulary is needed.

The result is returned as log-probabilities. Those are valid logits, since ``log_softmax`` leaves them
unchanged, so the loss and the search take them as they take the Generator's logits.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.attention.functional import attend
from attnkit.attention.invariance import cut_or_padded, elementwise_alike, key_groups

_TINY = 1e-30  # log(P) for a token that neither softmax (underflowed) nor the pointer gives anything


class PointerGenerator(nn.Module):
    """Mixes the vocabulary distribution with a copy distribution over the source's tokens."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.query = nn.Linear(d_model, d_model)  # h_t -> the pointer's query
        self.key = nn.Linear(d_model, d_model)  # memory -> the pointer's keys (computed once per source)
        self.switch = nn.Linear(2 * d_model, 1)  # [h_t; c_t] -> the logit of p_gen

    def keys(self, memory: Tensor) -> Tensor:
        """The pointer's keys ``(B, S, d_model)`` for the memory ``(B, S, d_model)``."""
        return self.key(memory)

    def forward(
        self, logits: Tensor, hidden: Tensor, keys: Tensor, memory: Tensor, src: Tensor, src_mask: Tensor
    ) -> Tensor:
        """Log-probabilities ``(B, T, V)`` of the next token.

        ``logits (B, T, V)`` and ``hidden (B, T, d_model)``: the Generator's logits and the decoder states
        they came from; ``keys`` (from :meth:`keys`) and ``memory``: ``(B, S, d_model)``; ``src (B, S)``:
        the source token ids; ``src_mask (B, 1, S)``: True where a source token is real.
        """
        context, alpha = self._attend(self.query(hidden), keys, memory, src_mask)
        # context (B, T, d_model), alpha (B, T, S)
        switch = self.switch(torch.cat([hidden, context], dim=-1)).float()  # (B, T, 1)
        p_gen = elementwise_alike(torch.sigmoid, switch, fill=0.0)  # (whatever the row's place in the batch)
        B, T, S = alpha.shape
        index = src[:, None, :].expand(B, T, S)
        copy = logits.new_zeros(logits.shape, dtype=torch.float32).scatter_add_(-1, index, alpha.float())
        probs = p_gen * logits.float().softmax(-1) + (1.0 - p_gen) * copy  # (B, T, V), sums to one
        return elementwise_alike(torch.log, probs.clamp_min(_TINY))

    @staticmethod
    def _attend(query: Tensor, keys: Tensor, memory: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        """``attend`` with its weights; in inference for each group of rows whose real source tokens,
        padded to a multiple of ``KEY_BUCKET``, are as many (``attnkit.attention.invariance``): a row's
        sums then run over the positions it has alone, whatever its batchmates' lengths."""
        if torch.is_grad_enabled():
            return attend(query, keys, memory, src_mask, need_weights=True)
        B, T, S = query.size(0), query.size(1), keys.size(1)
        row_groups = list(key_groups(src_mask))
        if len(row_groups) == 1 and row_groups[0][0] == S:  # every row padded to its own width already
            return attend(query, keys, memory, src_mask, need_weights=True)
        context = query.new_empty(B, T, memory.size(-1))  # (B, T, d_model)
        alpha = query.new_empty(B, T, S)
        for length, rows in row_groups:
            k, v = (cut_or_padded(x[rows], length, 1) for x in (keys, memory))  # (n, length, d_model)
            mask = cut_or_padded(src_mask[rows], length, -1)  # (n, 1, length)
            context[rows], weights = attend(query[rows], k, v, mask, need_weights=True)  # (n, T, length)
            alpha[rows] = cut_or_padded(weights, S, -1)
        return context, alpha
