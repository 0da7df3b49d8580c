"""An RNN encoder-decoder with attention: where attention started (Bahdanau et al., 2015; Luong et al., 2015).

The encoder is a bidirectional GRU or LSTM; each source position's annotation ``h_j`` is the forward and
backward states side by side (``d_hidden`` wide in all). The decoder predicts one target token a step:

- ``attention: bahdanau`` (Bahdanau et al. §3.1): the energies ``e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j)``
  come from the *previous* decoder state; the context ``c_i = Σ_j α_ij h_j`` enters the recurrent update
  ``s_i = f(s_{i-1}, [y_{i-1}; c_i])``, and the output layer reads ``[s_i; c_i; y_{i-1}]``.
- ``attention: dot | general | concat`` (Luong et al. §3.1): the *current* state ``h_t`` is computed
  first, the context ``c_t`` from ``score(h_t, h_j)``, then the attentional state
  ``h̃_t = tanh(W_c [c_t; h_t])`` gives the logits; with input feeding (§3.3) ``h̃_{t-1}`` joins the next
  input, so the model knows what it attended to before.
- ``attention: none``: the baseline without attention (Sutskever et al., 2014; Cho et al., 2014): the
  decoder starts from the encoder's final states and never looks back at the source.

The scores are the ones in ``attnkit.attention.scores`` and the weights come from ``attend`` with the
source's padding mask, so masked positions get exactly zero weight (no second copy of either).
``decoding(src)`` offers the step interface the one search uses (greedy, beam, sampling): the decoder's
state is its recurrent state and last attentional vector, reordered with the beams; there is no KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnkit.attention.functional import attend
from attnkit.attention.masks import padding_mask
from attnkit.attention.scores import BahdanauAdditive, LuongConcat, LuongGeneral, dot
from attnkit.errors import ConfigError, require_at_least, require_fraction, require_one_of
from attnkit.models.config import _Presets

ATTENTIONS = ("bahdanau", "dot", "general", "concat", "none")


@dataclass
class RNNConfig(_Presets):
    """An attentional RNN encoder-decoder (``arch: rnn``); the defaults: a GRU with Bahdanau attention."""

    ARCH: ClassVar[str] = "rnn"
    arch: str = "rnn"
    cell: str = "gru"  # "gru" or "lstm"
    attention: str = "bahdanau"  # "bahdanau", Luong's "dot" / "general" / "concat", or "none"
    layers: int = 1  # stacked recurrent layers on each side
    d_embed: int = 256
    d_hidden: int = 512  # decoder state, and encoder annotation (two directions of d_hidden / 2)
    dropout: float = 0.2  # on embeddings and on the decoder's output layer input
    input_feeding: bool = True  # Luong's h̃_{t-1} as part of the next input (Luong attention only)
    max_len: int = 256  # longest output the search makes (and source it reads)
    pad_id: int = 0  # set from the tokenizer's <pad>

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "rnn-small": {},
        "rnn-tiny": {"d_embed": 32, "d_hidden": 64, "dropout": 0.0},  # tests
    }

    @property
    def d_model(self) -> int:
        """The width the Noam schedule scales by (``d_model^-0.5``): the decoder state's."""
        return self.d_hidden

    def __post_init__(self) -> None:
        require_one_of("model.arch", self.arch, (self.ARCH,))
        require_one_of("model.cell", self.cell, ("gru", "lstm"))
        require_one_of("model.attention", self.attention, ATTENTIONS)
        for name in ("layers", "d_embed", "d_hidden", "max_len"):
            require_at_least(f"model.{name}", getattr(self, name), 1)
        if self.d_hidden % 2:
            raise ConfigError(f"model.d_hidden must be even (two encoder directions); got {self.d_hidden}")
        require_fraction("model.dropout", self.dropout)
        require_at_least("model.pad_id", self.pad_id, 0)


def _score(c: RNNConfig) -> Any:
    d = c.d_hidden
    return {"bahdanau": lambda: BahdanauAdditive(d, d), "dot": lambda: dot,
            "general": lambda: LuongGeneral(d, d), "concat": lambda: LuongConcat(d, d),
            "none": lambda: None}[c.attention]()  # fmt: skip


class RNNSeq2Seq(nn.Module):
    """``forward(src, tgt_in) -> logits (B, T, V)``; ``decoding(src)`` for search (module docstring)."""

    def __init__(self, config: RNNConfig, vocab_size: int) -> None:
        super().__init__()
        c = self.config = config
        self.vocab_size = vocab_size
        rnn = {"gru": nn.GRU, "lstm": nn.LSTM}[c.cell]
        self.embed = nn.Embedding(vocab_size, c.d_embed, padding_idx=c.pad_id)  # shared by both sides
        self.dropout = nn.Dropout(c.dropout)
        self.encoder = rnn(c.d_embed, c.d_hidden // 2, c.layers, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(c.d_hidden, c.d_hidden)  # s_0 = tanh(W [→h_S; ←h_1]) per layer
        self.luong = c.attention in ("dot", "general", "concat")
        feed = c.d_hidden if c.attention == "bahdanau" or (self.luong and c.input_feeding) else 0
        self.decoder = rnn(c.d_embed + feed, c.d_hidden, c.layers, batch_first=True)
        self.score = _score(c)
        if self.luong:
            self.combine = nn.Linear(2 * c.d_hidden, c.d_hidden, bias=False)  # W_c [c_t; h_t]
            out = c.d_hidden
        else:  # Bahdanau's output layer reads [s_i; c_i; y_{i-1}] (no context without attention)
            out = c.d_hidden + (c.d_hidden if c.attention == "bahdanau" else 0) + c.d_embed
        self.output = nn.Linear(out, vocab_size)

    # --- encoder ---------------------------------------------------------------------------------------

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor, Any]:
        """Annotations ``(B, S, d_hidden)``, the source mask ``(B, 1, S)`` and the decoder's first state."""
        mask = padding_mask(src, self.config.pad_id)  # (B, 1, S)
        lengths = mask.sum(-1).squeeze(-1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(self.dropout(self.embed(src)), lengths, batch_first=True,
                                                   enforce_sorted=False)  # fmt: skip
        out, final = self.encoder(packed)
        annotations, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        return annotations, mask, self._bridge(final)

    def _bridge(self, final: Any) -> Any:
        """Each layer's forward and backward final states, joined and mapped to the decoder's size."""

        def join(h: Tensor) -> Tensor:  # (2·layers, B, d/2) -> (layers, B, d)
            h = h.view(self.config.layers, 2, h.size(1), h.size(2))
            return torch.tanh(self.bridge(torch.cat([h[:, 0], h[:, 1]], dim=-1)))

        return tuple(join(h) for h in final) if isinstance(final, tuple) else join(final)

    # --- decoder ---------------------------------------------------------------------------------------

    def _context(self, query: Tensor, annotations: Tensor, mask: Tensor) -> Tensor:
        """``c = Σ_j α_j h_j`` for a query ``(B, 1, d)``: ``(B, 1, d_hidden)``."""
        context, _ = attend(query, annotations, annotations, mask, score=self.score)
        return context

    def step(self, y: Tensor, state: Any, feed: Tensor, annotations: Tensor, mask: Tensor):
        """One decoder step for the previous tokens ``y (B,)``: ``(logits (B, V), state, feed)``; ``feed``
        is Bahdanau's context or Luong's h̃ carried to the next step (``(B, 1, d_hidden)``)."""
        c = self.config
        embedded = self.dropout(self.embed(y).unsqueeze(1))  # (B, 1, d_embed)
        top = (state[0] if isinstance(state, tuple) else state)[-1].unsqueeze(1)  # s_{i-1}: (B, 1, d)
        if c.attention == "bahdanau":
            context = self._context(top, annotations, mask)  # from the previous state
            hidden, state = self.decoder(torch.cat([embedded, context], -1), state)
            features, feed = torch.cat([hidden, context, embedded], -1), context
        elif self.luong:
            inputs = torch.cat([embedded, feed], -1) if c.input_feeding else embedded
            hidden, state = self.decoder(inputs, state)
            context = self._context(hidden, annotations, mask)  # from the current state
            features = feed = torch.tanh(self.combine(torch.cat([context, hidden], -1)))  # h̃_t
        else:
            hidden, state = self.decoder(embedded, state)
            features = torch.cat([hidden, embedded], -1)
        return self.output(self.dropout(features)).squeeze(1), state, feed

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits ``(B, T, V)`` for ``src (B, S)`` and ``tgt_in (B, T)`` (``<s> y``)."""
        annotations, mask, state = self.encode(src)
        feed = annotations.new_zeros(src.size(0), 1, self.config.d_hidden)
        logits = []
        for t in range(tgt_in.size(1)):
            step_logits, state, feed = self.step(tgt_in[:, t], state, feed, annotations, mask)
            logits.append(step_logits)
        return torch.stack(logits, dim=1)

    def decoding(self, src: Tensor, use_cache: bool = True) -> RNNDecoding:
        return RNNDecoding(self, src)


class RNNDecoding:
    """The search's step interface: ``next_logits(tokens)`` runs the decoder over the tokens it has not
    seen yet (one per step), ``reorder(index)`` keeps the given rows of its state."""

    def __init__(self, model: RNNSeq2Seq, src: Tensor) -> None:
        self.model = model
        self.annotations, self.mask, self.state = model.encode(src)
        self.feed = self.annotations.new_zeros(src.size(0), 1, model.config.d_hidden)
        self.seen = 0

    def next_logits(self, tokens: Tensor) -> Tensor:
        logits = None
        for t in range(self.seen, tokens.size(1)):
            logits, self.state, self.feed = self.model.step(tokens[:, t], self.state, self.feed,
                                                            self.annotations, self.mask)  # fmt: skip
        self.seen = tokens.size(1)
        return logits

    def reorder(self, index: Tensor) -> None:
        pick = lambda h: h.index_select(1, index)  # noqa: E731  (layers, B, d)
        self.state = tuple(map(pick, self.state)) if isinstance(self.state, tuple) else pick(self.state)
        self.feed, self.annotations, self.mask = self.feed[index], self.annotations[index], self.mask[index]
