"""Listen, Attend and Spell (Chan et al., 2016): a speech recogniser that spells what it hears, one
character a step, attending to the frames of the utterance.

The **listener** (Chan et al. §3.1) reads log-mel frames (data/audio.py: ``n_mels`` numbers every
10 ms). It first stacks ``stack`` consecutive frames into one and keeps every ``stack``-th (a lower
frame rate, as later LAS systems do, for speed), then runs a bidirectional LSTM, then ``pyramid``
*pyramidal* BLSTM layers: each joins two consecutive outputs of the layer below into one input, so
the time resolution halves at each (eq. 5: ``h_i^j = pBLSTM(h_{i-1}^j, [h_{2i}^{j-1}; h_{2i+1}^{j-1}])``).
An utterance of ``T`` frames becomes ``T / (stack · 2^pyramid)`` annotations ``h`` (30 frames a second
are 4 annotations ... ``d_hidden`` wide): fewer places to attend to, each holding more sound, which is
what lets attention find its way (Chan et al.: without the pyramid the model did not converge).

The **speller** is the RNN decoder of models/rnn.py: an LSTM that reads the previous character and
the context, with location-aware attention by default (``attention: location``, Chorowski et al.,
2015: Bahdanau's additive score plus features of the previous step's weights), or plain additive
attention (``bahdanau``) to compare. Its first state comes from the mean annotation
(:class:`~attnkit.models.rnn.MeanBridge`).

Attention finds the alignment late: a speller first learns to write likely dates from the characters
it has written, and only then to listen. ``guided_attention: λ`` adds Tachibana et al.'s (2018,
"Efficiently trainable text-to-speech system based on deep convolutional networks with guided
attention", §4.1) *guided attention* loss, which charges a weight on annotation ``s`` of ``S`` at
character ``n`` of ``N`` by how far it is from the diagonal, ``W_ns = 1 - exp(-(n/N - s/S)² / 2g²)``
(``guided_width: g``): ``λ Σ_n Σ_s α_ns W_ns``. Speech is spoken at a steady pace, so the diagonal is
roughly right, and it draws the weights near the right place from the first steps.

An utterance's frames are padded with zero frames to the batch's longest; a frame of exact zeros is
never a real one (the features are normalised log energies), so :func:`frame_lengths` reads each
utterance's length from them and the model takes the padded features alone, as the search needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnkit.errors import ConfigError, require_at_least
from attnkit.models.rnn import MeanBridge, RNNConfig, RNNSeq2Seq
from attnkit.models.rnn_attention import Alignment, Source


@dataclass
class ListenAttendSpellConfig(RNNConfig):
    """A Listen-Attend-Spell recogniser (``arch: listen-attend-spell``); RNNConfig's fields for its
    speller."""

    ARCH: ClassVar[str] = "listen-attend-spell"
    arch: str = "listen-attend-spell"
    cell: str = "lstm"
    attention: str = "location"  # Chorowski's location-aware attention (or bahdanau, dot, ...)
    n_mels: int = 40  # features a frame (set from the data)
    sample_rate: int = 16000  # Hz of the sound trained on: other sound is resampled to it (data/audio.py)
    stack: int = 3  # frames stacked into one at the input: 10 ms frames -> 30 ms
    pyramid: int = 2  # pyramidal BLSTM layers, each halving the frames
    max_len: int = 100  # longest transcript the search spells, in characters

    local: str = "median"  # attend within ``window`` annotations of the last step's median (Bahdanau 2016)
    window: int = 2  # D, in annotations: ± 240 ms at 120 ms each
    guided_attention: float = 0.0  # λ of the guided attention loss (module docstring; Tachibana et al.)
    guided_width: float = 0.2  # g: how far from the diagonal a weight goes uncharged, in shares of S

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "las-small": {"d_embed": 64, "d_hidden": 256, "dropout": 0.1},
        "las-tiny": {"d_embed": 16, "d_hidden": 32, "dropout": 0.0, "pyramid": 1},  # tests
    }

    @property
    def reduction(self) -> int:
        """Frames per annotation."""
        return self.stack * 2**self.pyramid

    def annotations(self, frames: int) -> int:
        """How many annotations the listener makes of an utterance of ``frames`` frames (the last one
        of fewer frames): ``⌈frames / reduction⌉``."""
        return -(-frames // self.reduction)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.attention == "none":
            raise ConfigError(
                "model.attention: a speller attends to the frames; choose location, bahdanau, ..."
            )
        if self.hard:
            raise ConfigError(
                "model.hard: Listen, Attend and Spell attends softly; hard attention is for images"
            )
        require_at_least("model.n_mels", self.n_mels, 1)
        require_at_least("model.sample_rate", self.sample_rate, 8000)
        require_at_least("model.stack", self.stack, 1)
        require_at_least("model.pyramid", self.pyramid, 0)
        require_at_least("model.guided_attention", self.guided_attention, 0.0)
        require_at_least("model.guided_width", self.guided_width, 0.0, strictly=True)


def frame_lengths(frames: Tensor) -> Tensor:
    """How many frames of each padded utterance ``frames (B, T, n_mels)`` are real, ``(B,)``: up to its
    last frame that is not all zeros (see the module docstring); at least one."""
    real = frames.ne(0).any(-1)  # (B, T)
    positions = torch.arange(1, frames.size(1) + 1, device=frames.device)
    return (real * positions).amax(-1).clamp(min=1)


class BidirectionalLSTM(nn.Module):
    """An LSTM each way over the first ``lengths`` steps of each row of ``x (B, T, inputs)``: ``(B, T,
    2 · hidden)``, the two directions side by side, zeros after each row's end.

    The forward LSTM reads the padded rows as they are (padding only follows a row's real steps); the
    backward one reads each row with its real steps reversed, so that it too starts at the row's end
    and never at padding, and its outputs are put back in order. The same as ``nn.LSTM(bidirectional=
    True)`` over a packed sequence, and on a CPU several times faster to train: packing's backward pass
    clears and adds a gradient as large as the whole batch at every time step.
    """

    def __init__(self, inputs: int, hidden: int) -> None:
        super().__init__()
        self.forwards = nn.LSTM(inputs, hidden, batch_first=True)
        self.backwards = nn.LSTM(inputs, hidden, batch_first=True)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        steps = torch.arange(x.size(1), device=x.device)[None, :]  # (1, T)
        lengths = lengths.to(x.device)[:, None]  # (B, 1)
        real = steps < lengths  # (B, T)
        reverse = torch.where(real, lengths - 1 - steps, steps)  # (B, T): a row's real steps reversed
        ahead, _ = self.forwards(x)  # (B, T, hidden)
        behind, _ = self.backwards(x.gather(1, reverse[..., None].expand_as(x)))
        behind = behind.gather(1, reverse[..., None].expand_as(behind))  # back in order
        return torch.cat([ahead, behind], -1) * real[..., None]  # (B, T, 2 · hidden)


class Listener(nn.Module):
    """Frames ``(B, T, n_mels)`` -> annotations ``(B, T / reduction, d_hidden)`` and their lengths: a
    BLSTM over stacked frames, then the pyramidal BLSTMs (module docstring)."""

    def __init__(self, config: ListenAttendSpellConfig) -> None:
        super().__init__()
        c, half = config, config.d_hidden // 2
        self.stack = c.stack
        self.bottom = BidirectionalLSTM(c.n_mels * c.stack, half)
        self.pyramid = nn.ModuleList(BidirectionalLSTM(2 * c.d_hidden, half) for _ in range(c.pyramid))
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, frames: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        h, lengths = _joined(frames, lengths, self.stack)  # (B, T / stack, stack · n_mels)
        h = self.bottom(h, lengths)  # (B, T / stack, d_hidden)
        for layer in self.pyramid:
            h, lengths = _joined(self.dropout(h), lengths, 2)  # (B, T', 2 · d_hidden), T' halved
            h = layer(h, lengths)  # (B, T', d_hidden)
        return h, lengths


def _joined(x: Tensor, lengths: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Each ``k`` consecutive steps of ``x (B, T, d)`` side by side, ``(B, ⌈T / k⌉, k · d)`` (the last
    group padded with zeros), and the new lengths (a group with any real step is real)."""
    B, T, d = x.shape
    padded = nn.functional.pad(x, (0, 0, 0, -T % k))  # (B, k · ⌈T / k⌉, d)
    return padded.reshape(B, -1, k * d), torch.div(lengths + k - 1, k, rounding_mode="floor")


class ListenAttendSpell(RNNSeq2Seq):
    """``forward(frames, tgt_in) -> logits (B, T, V)``, ``alignments(frames, tgt_in) -> (B, T, S)``
    (each character's attention over the annotations, ``reduction`` frames each); ``decoding(frames)``
    for search. The RNN translation model with the listener in place of the text encoder."""

    def __init__(self, config: ListenAttendSpellConfig, vocab_size: int) -> None:
        super().__init__(config, vocab_size)
        c = config
        self.encoder = Listener(c)  # in place of the translation model's bidirectional RNN
        self.bridge = MeanBridge(c.d_hidden, c.layers, c.cell)
        self._kept: tuple[Tensor, Tensor] | None = None  # while training: (α (B, T, S), S of each row)
        self._lengths: Tensor | None = None  # the last training forward's annotations a row, (B,)

    def encode(self, frames: Tensor) -> tuple[Source, Any]:
        """The annotations to attend to and the speller's first state, for ``frames (B, T, n_mels)``
        (zero frames after each utterance's end)."""
        annotations, lengths = self.encoder(frames, frame_lengths(frames))  # (B, S, d_hidden), (B,)
        self._lengths = lengths if self.training else None
        positions = torch.arange(annotations.size(1), device=frames.device)
        mask = (positions[None, :] < lengths[:, None].to(frames.device)).unsqueeze(1)  # (B, 1, S)
        return self.attention.prepare(annotations, mask), self.bridge(annotations, mask)

    def _keep_for_losses(self, alignments: list[Alignment | None]) -> None:
        """The weights of a training forward, for :meth:`attention_penalty` (when it is asked for)."""
        super()._keep_for_losses(alignments)
        if self.config.guided_attention > 0 and self._lengths is not None:
            weights = torch.stack([a.weights for a in alignments if a is not None], 1)  # (B, T, S)
            self._kept = weights, self._lengths

    def attention_penalty(self, targets: Tensor) -> Tensor:
        """The guided attention loss of the last training forward (module docstring), zero without
        ``guided_attention``: ``λ Σ α_ns W_ns`` over the steps that predict a real token of ``targets
        (B, T)`` (``N`` of them in a row) and the row's ``S`` real annotations."""
        if self._kept is None:
            return targets.new_zeros((), dtype=torch.float)
        (weights, lengths), self._kept = self._kept, None
        steps = targets != self.config.pad_id  # (B, T)
        N = steps.sum(1, keepdim=True).clamp(min=1)[..., None].to(weights.dtype)  # (B, 1, 1)
        S = lengths.to(weights.device, weights.dtype)[:, None, None]  # (B, 1, 1)
        n = torch.arange(weights.size(1), device=weights.device)[None, :, None] / N  # (B, T, 1)
        s = torch.arange(weights.size(2), device=weights.device)[None, None, :] / S  # (B, 1, S)
        off_diagonal = 1 - torch.exp(-(n - s).square() / (2 * self.config.guided_width**2))  # (B, T, S)
        charged = torch.where(steps[..., None], weights * off_diagonal, 0.0)  # padding: weights are 0
        return self.config.guided_attention * charged.sum()
