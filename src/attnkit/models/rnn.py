"""An RNN encoder-decoder with attention: where attention started (Bahdanau et al., 2015; Luong et al., 2015).

The encoder is a bidirectional GRU or LSTM; each source position's annotation ``h_j`` is the forward and
backward states side by side (``d_hidden`` wide in all). The decoder predicts one target token a step:

- ``attention: bahdanau`` (Bahdanau et al. §3.1): the energies ``e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j)``
  come from the *previous* decoder state; the context ``c_i = Σ_j α_ij h_j`` enters the recurrent update
  ``s_i = f(s_{i-1}, [y_{i-1}; c_i])``, and the output layer reads ``[s_i; c_i; y_{i-1}]``.
- ``attention: location`` (Chorowski et al., 2015): the same decoder, the energies also reading where
  the previous step attended (``+ U (F * α_{i-1})_j``): location-aware attention, for speech.
- ``attention: dot | general | concat`` (Luong et al. §3.1): the *current* state ``h_t`` is computed
  first, the context ``c_t`` from ``score(h_t, h_j)``, then the attentional state
  ``h̃_t = tanh(W_c [c_t; h_t])`` gives the logits; with input feeding (§3.3) ``h̃_{t-1}`` joins the next
  input, so the model knows what it attended to before.
- ``attention: none``: the baseline without attention (Sutskever et al., 2014; Cho et al., 2014): the
  decoder starts from the encoder's final states and never looks back at the source.

Two choices refine any of the scores (``rnn_attention.py`` holds the attention):

- ``local: local-m | local-p`` (Luong et al. §3.2): attend only within ``[p_t - D, p_t + D]``
  (``window: D``), around ``p_t = t`` (monotonic) or a predicted ``p_t`` with a Gaussian preference;
  ``local: median`` (Bahdanau et al., 2016): around the median of the previous step's weights.
- ``hard: true`` (Xu et al., 2015, §4.1): attend to *one* sampled position, trained with REINFORCE
  (``hard_expected``: the share of training sentences that take the expected context instead).

The scores are the ones in ``attnkit.attention.scores`` and the weights come from its softmax with the
source's padding mask, so masked positions get exactly zero weight (no second copy of either).
``decoding(src)`` offers the step interface the one search uses (greedy, beam, sampling): the decoder's
state is its recurrent state and last attentional vector, reordered with the beams; there is no KV cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnkit.attention.invariance import cut_or_padded
from attnkit.attention.masks import padding_mask
from attnkit.errors import ConfigError, require_at_least, require_fraction, require_one_of
from attnkit.models.config import _Presets
from attnkit.models.rnn_attention import Alignment, Source, SourceAttention, make_source
from attnkit.nn.reinforce import MovingAverageBaseline, reinforce_loss

ATTENTIONS = ("bahdanau", "location", "dot", "general", "concat", "none")
LOCAL = ("none", "local-m", "local-p", "median")


@dataclass
class RNNConfig(_Presets):
    """An attentional RNN encoder-decoder (``arch: rnn``); the defaults: a GRU with Bahdanau attention."""

    ARCH: ClassVar[str] = "rnn"
    arch: str = "rnn"
    cell: str = "gru"  # "gru" or "lstm"
    # "bahdanau", "location" (Chorowski's location-aware: Bahdanau's plus where the last step looked),
    # Luong's "dot" / "general" / "concat", or "none"
    attention: str = "bahdanau"
    # global attention, Luong's "local-m" / "local-p" window, or "median": around the last step's median
    local: str = "none"
    window: int = 10  # D: a local window spans [p_t - D, p_t + D] (Luong's D = 10)
    hard: bool = False  # attend to one sampled position, trained with REINFORCE (Xu et al., 2015)
    entropy_bonus: float = 0.01  # hard attention: λ_e, the weight of the attention entropy (Xu eq. 12)
    hard_expected: float = 0.5  # hard attention: share of training sentences given Σ α h (Xu et al. §4.1)
    hard_soft_batches: int = 0  # hard attention: the first training batches all take Σ α h (a soft start)
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
        require_one_of("model.local", self.local, LOCAL)
        for name in ("layers", "d_embed", "d_hidden", "max_len", "window"):
            require_at_least(f"model.{name}", getattr(self, name), 1)
        if self.d_hidden % 2:
            raise ConfigError(f"model.d_hidden must be even (two encoder directions); got {self.d_hidden}")
        if self.attention == "none" and (self.local != "none" or self.hard):
            raise ConfigError("model.local and model.hard refine an attention; model.attention is none")
        require_fraction("model.dropout", self.dropout)
        require_fraction("model.hard_expected", self.hard_expected)
        require_at_least("model.entropy_bonus", self.entropy_bonus, 0.0)
        require_at_least("model.hard_soft_batches", self.hard_soft_batches, 0)
        require_at_least("model.pad_id", self.pad_id, 0)


class StepRNN(nn.Module):
    """The decoder's stacked LSTM or GRU, run one step at a time: ``(x (B, 1, input), state) ->
    (output (B, 1, hidden), state)`` as ``nn.LSTM`` / ``nn.GRU`` with ``batch_first`` give them, with
    their parameters (the same names, shapes and initialisation: a checkpoint of either loads) and their
    documented equations, written out:

    - LSTM: ``i, f, g, o = W_i x + b_i + W_h h + b_h`` (four blocks), ``c' = σ(f) c + σ(i) tanh(g)``,
      ``h' = σ(o) tanh(c')``;
    - GRU: ``r, z = σ(W_ir x + b_ir + W_hr h + b_hr), σ(...)``, ``n = tanh(W_in x + b_in + r (W_hn h +
      b_hn))``, ``h' = (1 - z) n + z h``.

    Why not ``nn.LSTM`` itself: on a CPU it runs each call as a oneDNN RNN primitive, whose set-up costs
    tens of milliseconds whatever the length, and a decoder calls it once a step (forward and backward):
    it was nine tenths of a speech model's training step. These few matrix products and element-wise
    operations cost a fraction of a millisecond at the decoder's sizes, and follow autocast's bf16.
    """

    # ``x Wᵀ + b``: attnkit.cpu gives this instance its own, whose rows sum alike in any batch
    linear: Callable[..., Tensor] = staticmethod(nn.functional.linear)

    def __init__(self, cell: str, input_size: int, hidden_size: int, layers: int) -> None:
        super().__init__()
        self.lstm, self.hidden_size, self.layers = cell == "lstm", hidden_size, layers
        gates = (4 if self.lstm else 3) * hidden_size
        bound = hidden_size**-0.5  # PyTorch's initialisation: U(-1/√hidden, 1/√hidden) for every parameter
        for k in range(layers):
            inputs = input_size if k == 0 else hidden_size
            shapes = {f"weight_ih_l{k}": (gates, inputs), f"weight_hh_l{k}": (gates, hidden_size),
                      f"bias_ih_l{k}": (gates,), f"bias_hh_l{k}": (gates,)}  # fmt: skip
            for name, shape in shapes.items():
                self.register_parameter(name, nn.Parameter(torch.empty(shape).uniform_(-bound, bound)))

    def forward(self, x: Tensor, state: Any) -> tuple[Tensor, Any]:
        h_all, c_all = state if self.lstm else (state, None)  # (layers, B, hidden) each
        h_new, c_new = [], []
        inputs = x.squeeze(1)  # (B, input)
        for k in range(self.layers):
            weights = [
                getattr(self, f"{name}_l{k}") for name in ("weight_ih", "bias_ih", "weight_hh", "bias_hh")
            ]
            from_x = self.linear(inputs, weights[0], weights[1])  # (B, gates)
            from_h = self.linear(h_all[k], weights[2], weights[3])
            if self.lstm:
                i, f, g, o = (from_x + from_h).chunk(4, -1)
                c = torch.sigmoid(f) * c_all[k] + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                c_new.append(c)
            else:
                (x_r, x_z, x_n), (h_r, h_z, h_n) = from_x.chunk(3, -1), from_h.chunk(3, -1)
                r, z = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
                h = (1 - z) * torch.tanh(x_n + r * h_n) + z * h_all[k]
            h_new.append(h)
            inputs = h
        h_stack = torch.stack(h_new)  # (layers, B, hidden)
        return inputs.unsqueeze(1), ((h_stack, torch.stack(c_new)) if self.lstm else h_stack)


class MeanBridge(nn.Linear):
    """The decoder's first state from the mean annotation, ``h_0 (, c_0) = tanh(W · mean_j h_j + b)``
    (Xu et al., 2015, §3.1.2, ``f_init``), for an encoder whose last states sum up nothing (an image's
    regions, an utterance's frames): every layer's state (and an LSTM's cell) from one linear map."""

    linear: Callable[..., Tensor] = staticmethod(nn.functional.linear)  # as StepRNN's

    def __init__(self, d_hidden: int, layers: int, cell: str) -> None:
        self.states = layers * (2 if cell == "lstm" else 1)  # h_0 (and c_0) of every layer
        self.d_hidden, self.lstm = d_hidden, cell == "lstm"
        super().__init__(d_hidden, self.states * d_hidden)

    def forward(self, annotations: Tensor, mask: Tensor) -> Any:  # type: ignore[override]
        """``annotations (B, S, d_hidden)``, real at ``mask (B, 1, S)`` -> ``(layers, B, d_hidden)``, or
        the pair ``(h_0, c_0)`` for an LSTM."""
        real = mask.squeeze(1).unsqueeze(-1).to(annotations.dtype)  # (B, S, 1)
        mean = (annotations * real).sum(1) / real.sum(1).clamp(min=1)  # (B, d_hidden)
        first = torch.tanh(self.linear(mean, self.weight, self.bias))  # (B, states · d_hidden)
        first = first.view(-1, self.states, self.d_hidden).transpose(0, 1)  # (states, B, d_hidden)
        if self.lstm:
            return tuple(h.contiguous() for h in first.chunk(2))
        return first.contiguous()  # (states, B, d_hidden)


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
        self.additive = c.attention in ("bahdanau", "location")  # Bahdanau's decoder: attend, then step
        feed = c.d_hidden if self.additive or (self.luong and c.input_feeding) else 0
        self.decoder = StepRNN(
            c.cell, c.d_embed + feed, c.d_hidden, c.layers
        )  # nn.LSTM's maths, a step a call
        if c.attention != "none":
            self.attention = SourceAttention(
                c.attention, c.d_hidden, c.local, c.window, c.hard, c.hard_expected, c.hard_soft_batches
            )
        if c.hard:
            self.baseline = MovingAverageBaseline()
        if self.luong:
            self.combine = nn.Linear(2 * c.d_hidden, c.d_hidden, bias=False)  # W_c [c_t; h_t]
            out = c.d_hidden
        else:  # Bahdanau's output layer reads [s_i; c_i; y_{i-1}] (no context without attention)
            out = c.d_hidden + (c.d_hidden if self.additive else 0) + c.d_embed
        self.output = nn.Linear(out, vocab_size)
        self._choices: tuple[Tensor, Tensor] | None = None  # hard attention's (log p, entropy), training

    # --- encoder ---------------------------------------------------------------------------------------

    def encode(self, src: Tensor) -> tuple[Source, Any]:
        """The source to attend to (annotations ``(B, S, d_hidden)``) and the decoder's first state."""
        c = self.config
        lengths = (src != c.pad_id).sum(-1).clamp(min=1).cpu()
        annotations, final = self._encoded(self.dropout(self.embed(src)), lengths)
        mask = padding_mask(src, c.pad_id)  # (B, 1, S)
        if c.attention == "none":  # nothing to attend to
            return make_source(annotations, mask), self._bridge(final)
        return self.attention.prepare(annotations, mask), self._bridge(final)

    def _encoded(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Any]:
        """The bidirectional encoder over each row's first ``lengths`` steps of ``x (B, S, d_embed)``:
        the annotations ``(B, S, d_hidden)``, zeros past a row's end, and the final states. In inference
        each row alone: an RNN kernel's products, and a packed batch's rows that end one after another,
        would sum a row in another order in another batch (docs/invariance.md)."""
        if torch.is_grad_enabled():
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, final = self.encoder(packed)
            return nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.size(1))[0], final
        rows = [self.encoder(x[i : i + 1, :n]) for i, n in enumerate(lengths.tolist())]
        annotations = torch.cat([cut_or_padded(out, x.size(1), 1) for out, _ in rows])  # (B, S, d_hidden)
        finals = [final for _, final in rows]  # each (2 · layers, 1, d_hidden / 2), or an LSTM's (h, c)
        if isinstance(finals[0], tuple):
            return annotations, tuple(torch.cat(states, 1) for states in zip(*finals, strict=True))
        return annotations, torch.cat(finals, 1)

    def _bridge(self, final: Any) -> Any:
        """Each layer's forward and backward final states, joined and mapped to the decoder's size."""

        def join(h: Tensor) -> Tensor:  # (2·layers, B, d/2) -> (layers, B, d)
            h = h.view(self.config.layers, 2, h.size(1), h.size(2))
            return torch.tanh(self.bridge(torch.cat([h[:, 0], h[:, 1]], dim=-1)))

        return tuple(join(h) for h in final) if isinstance(final, tuple) else join(final)

    # --- decoder ---------------------------------------------------------------------------------------

    def step(self, y: Tensor, t: int, state: Any, feed: Tensor, source: Source):
        """One decoder step for the previous tokens ``y (B,)`` at target position ``t``:
        ``(logits (B, V), state, feed, alignment or None)``; ``feed`` is Bahdanau's context or Luong's
        h̃ carried to the next step (``(B, 1, d_hidden)``)."""
        features, state, feed, alignment = self._advance(y, t, state, feed, source)
        return self.output(self.dropout(features)).squeeze(1), state, feed, alignment

    def _advance(self, y: Tensor, t: int, state: Any, feed: Tensor, source: Source):
        """``step`` up to the output layer: the features ``(B, 1, ·)`` the logits are computed from."""
        c = self.config
        embedded = self.dropout(self.embed(y).unsqueeze(1))  # (B, 1, d_embed)
        alignment = None
        if self.additive:
            top = (state[0] if isinstance(state, tuple) else state)[-1].unsqueeze(1)  # s_{i-1}: (B, 1, d)
            context, alignment = self.attention(top, t, source)  # from the previous state
            hidden, state = self.decoder(torch.cat([embedded, context], -1), state)
            features, feed = torch.cat([hidden, context, embedded], -1), context
        elif self.luong:
            inputs = torch.cat([embedded, feed], -1) if c.input_feeding else embedded
            hidden, state = self.decoder(inputs, state)
            context, alignment = self.attention(hidden, t, source)  # from the current state
            features = feed = torch.tanh(self.combine(torch.cat([context, hidden], -1)))  # h̃_t
        else:
            hidden, state = self.decoder(embedded, state)
            features = torch.cat([hidden, embedded], -1)
        return features, state, feed, alignment

    def start(self, src: Tensor) -> tuple[Source, Any, Tensor]:
        """What the first decoder step needs: the encoded source, the first state, and no feed yet
        (zeros ``(B, 1, d_hidden)``)."""
        source, state = self.encode(src)
        return source, state, source.annotations.new_zeros(src.size(0), 1, self.config.d_hidden)

    def _decode(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, list[Alignment | None]]:
        """Teacher-forced output features ``(B, T, ·)`` (what :attr:`output_layer` projects) and each
        step's alignment."""
        source, state, feed = self.start(src)
        features, alignments = [], []
        for t in range(tgt_in.size(1)):
            step_features, state, feed, alignment = self._advance(tgt_in[:, t], t, state, feed, source)
            features.append(step_features)
            alignments.append(alignment)
        return self.dropout(torch.cat(features, dim=1)), alignments  # projected at once: (B·T, ·) x (·, V)

    @property
    def output_layer(self) -> nn.Linear:
        """The pre-softmax linear map of the (deep) output features."""
        return self.output

    def forward(self, src: Tensor, tgt_in: Tensor, project: bool = True) -> Tensor:
        """Teacher-forced logits ``(B, T, V)`` for ``src (B, S)`` and ``tgt_in (B, T)`` (``<s> y``);
        ``project=False``: the output features, for a loss that applies :attr:`output_layer` itself."""
        features, alignments = self._decode(src, tgt_in)
        if self.training:
            self._keep_for_losses(alignments)
        return self.output(features) if project else features

    def _keep_for_losses(self, alignments: list[Alignment | None]) -> None:
        """What a training forward's attention leaves for the losses that need the targets too: hard
        attention's choices, for :meth:`policy_loss`."""
        if self.config.hard:
            self._choices = (
                torch.stack([a.log_prob for a in alignments], 1),  # (B, T)
                torch.stack([a.entropy for a in alignments], 1),
            )

    @torch.no_grad()
    def alignments(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """The attention weights of every target step, ``(B, T, S)`` (for heat maps)."""
        if self.config.attention == "none":
            raise ValueError("a model with attention: none attends to nothing")
        return torch.stack([a.weights for a in self._decode(src, tgt_in)[1]], dim=1)

    def policy_loss(self, log_likelihood: Tensor, targets: Tensor) -> Tensor:
        """Hard attention's REINFORCE term for the last training forward (zero for soft attention),
        given each target token's log-likelihood ``(B, T)`` (detached) and the targets.

        Each sampled position is credited with the log-likelihood of the token predicted at its step,
        against a moving-average baseline of those, plus the entropy bonus ``λ_e Σ H(α_t)`` (Xu et al.
        eq. 12). Xu et al. credit every choice with the whole output's log-likelihood, which is unbiased
        but noisier: on the copy task the per-step reward learned sharper alignments in the same steps.
        It ignores what a choice does to later steps through the decoder state, a small bias.
        """
        if self._choices is None:
            return log_likelihood.new_zeros(())
        (log_prob, entropy), self._choices = self._choices, None
        keep = targets != self.config.pad_id  # (B, T)
        baseline = self.baseline.update(log_likelihood[keep])
        chosen = torch.where(keep, log_prob, 0.0)  # (B, T)
        bonus = torch.where(keep, entropy, 0.0).sum()
        return reinforce_loss(chosen, log_likelihood, baseline) - self.config.entropy_bonus * bonus

    def decoding(self, src: Tensor, use_cache: bool = True) -> RNNDecoding:
        return RNNDecoding(self, src)


class RNNDecoding:
    """The search's step interface: ``next_logits(tokens)`` runs the decoder over the tokens it has not
    seen yet (one per step), ``reorder(index)`` keeps the given rows of its state."""

    def __init__(self, model: RNNSeq2Seq, src: Tensor) -> None:
        self.model = model
        self.source, self.state, self.feed = model.start(src)
        self.seen = 0

    def next_logits(self, tokens: Tensor) -> Tensor:
        logits = None
        for t in range(self.seen, tokens.size(1)):
            logits, self.state, self.feed, _ = self.model.step(
                tokens[:, t], t, self.state, self.feed, self.source
            )
        self.seen = tokens.size(1)
        return logits

    def reorder(self, index: Tensor) -> None:
        pick = lambda h: h.index_select(1, index)  # noqa: E731  (layers, B, d)
        self.state = tuple(map(pick, self.state)) if isinstance(self.state, tuple) else pick(self.state)
        self.feed, self.source = self.feed[index], self.source.select(index)

    keep = reorder  # each row carries its own source: keeping rows of different sources is the same

    def repeat(self, times: int) -> None:
        """Each row becomes ``times`` consecutive rows (beam search's beams): encoded once."""
        self.reorder(torch.arange(self.feed.size(0), device=self.feed.device).repeat_interleave(times))
