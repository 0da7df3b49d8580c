"""Show, Attend and Tell (Xu et al., 2015): an image captioner whose RNN decoder attends to regions of the
image, softly or hard.

The **encoder** (Xu et al. §3.1.1) is a small convolutional network: three 3×3 convolutions, each
followed by a ReLU and a 2×2 max-pool, turn a ``image_size``² grey image into an ``(image_size / 8)``²
grid of feature vectors (a 48-pixel scene: 6×6 = 36 regions of 8×8 pixels, each seeing 22 pixels
around it); a linear map takes each to ``d_hidden``, and each region adds a learned embedding of its
place in the grid (as a vision Transformer's patches do: Xu et al.'s 14×14 VGG grid kept where a region
is only through its borders' padding, and a caption here says where each digit is). These are the
annotations ``a_i``, ``L`` of them.

The **decoder** is the RNN decoder of models/rnn.py (Bahdanau's additive attention by default, as Xu
et al.'s ``f_att``: ``e_ti = v_aᵀ tanh(W_a h_{t-1} + U_a a_i)``, eq. 4–5), an LSTM whose first state is
computed from the mean annotation (Xu et al. §3.1.2: ``h_0, c_0 = f_init(1/L Σ_i a_i)``), with a deep
output layer reading ``[h_t; ẑ_t; Ey_{t-1}]`` (eq. 7).

- **soft attention** (§4.2): the context is the expectation ``ẑ_t = Σ_i α_ti a_i``, trained by
  backpropagation, with the *doubly stochastic regularisation* (eq. 14): ``λ Σ_i (1 - Σ_t α_ti)²``
  (``doubly_stochastic``: λ) asks that over the caption every region be attended to about once.
- **hard attention** (§4.1, ``hard: true``): one region ``s_t ~ Multinoulli(α_t)`` a step, trained by
  REINFORCE with a moving-average baseline and an entropy bonus (eq. 12; nn/reinforce.py), and, as Xu et
  al. do, half the captions given the expected context instead; when decoding, the most likely region.

Xu et al.'s gating scalar β (§4.2.1) is left out. ``decoding(images)`` offers the one search's step
interface (greedy, beam, sampling), as the RNN translation model does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnkit.attention.invariance import each_alone
from attnkit.errors import ConfigError, require_at_least
from attnkit.models.rnn import MeanBridge, RNNConfig, RNNSeq2Seq
from attnkit.models.rnn_attention import Alignment, Source

DOWNSAMPLING = 8  # three 2×2 max-pools: a region is 8×8 pixels


@dataclass
class CaptionerConfig(RNNConfig):
    """A Show-Attend-Tell captioner (``arch: show-attend-tell``); RNNConfig's fields for its decoder."""

    ARCH: ClassVar[str] = "show-attend-tell"
    arch: str = "show-attend-tell"
    cell: str = "lstm"  # Xu et al.'s decoder is an LSTM
    image_size: int = 48  # the images' side in pixels (set from the data)
    channels: int = 64  # the convolutions' width (the first has half)
    doubly_stochastic: float = 1.0  # λ of the doubly stochastic regularisation (soft attention; Xu eq. 14)
    max_len: int = 40  # longest caption the search makes

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "captioner-small": {"d_embed": 64, "d_hidden": 256, "dropout": 0.1},
        "captioner-tiny": {"d_embed": 16, "d_hidden": 32, "channels": 8, "dropout": 0.0},  # tests
    }

    @property
    def regions(self) -> int:
        """``L``: the annotations a caption attends to."""
        return (self.image_size // DOWNSAMPLING) ** 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.attention == "none":
            raise ConfigError("model.attention: a captioner attends to the image; choose bahdanau, dot, ...")
        if self.local != "none":
            raise ConfigError("model.local: local windows are for sequences; a captioner attends to regions")
        check_image_fields(self)
        require_at_least("model.doubly_stochastic", self.doubly_stochastic, 0.0)


def _block(inputs: int, outputs: int) -> list[nn.Module]:
    """A 3×3 convolution, a ReLU, a 2×2 max-pool: half the side."""
    return [nn.Conv2d(inputs, outputs, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]


class ImageEncoder(nn.Module):
    """Pixels ``(B, 1, H, W)`` -> annotations ``(B, L, width)``, one per 8×8 region (module docstring):
    ``channels`` wide convolutions, then a linear map to ``width`` plus each region's learned place."""

    def __init__(self, channels: int, width: int, regions: int) -> None:
        super().__init__()
        c, half = channels, channels // 2
        self.convolutions = nn.Sequential(*_block(1, half), *_block(half, c), *_block(c, c))
        self.project = nn.Linear(c, width)
        self.places = nn.Parameter(torch.zeros(regions, width))  # each region's place

    def forward(self, images: Tensor) -> Tensor:
        features = each_alone(self.convolutions, images)  # (B, C, H/8, W/8), in inference as alone
        regions = features.flatten(2).transpose(1, 2)  # (B, L, C), row by row
        return self.project(regions) + self.places  # (B, L, width)


def check_image_fields(config: Any) -> None:
    """The checks of a captioner's image fields (``image_size``, ``channels``), each naming its field."""
    if config.image_size % DOWNSAMPLING:
        raise ConfigError(f"model.image_size must be a multiple of {DOWNSAMPLING}; got {config.image_size}")
    require_at_least("model.image_size", config.image_size, DOWNSAMPLING)
    require_at_least("model.channels", config.channels, 2)


class Captioner(RNNSeq2Seq):
    """``forward(images, tgt_in) -> logits (B, T, V)``, ``alignments(images, tgt_in) -> (B, T, L)``
    (each step's attention over the regions, row by row of the grid); ``decoding(images)`` for search.
    The RNN translation model with the image encoder in place of the text encoder (module docstring)."""

    def __init__(self, config: CaptionerConfig, vocab_size: int) -> None:
        super().__init__(config, vocab_size)
        c = config
        self.encoder = ImageEncoder(c.channels, c.d_hidden, c.regions)  # in place of the text encoder
        self.bridge = MeanBridge(c.d_hidden, c.layers, c.cell)  # f_init of the mean annotation
        self._weights: Tensor | None = None  # soft attention's α while training: (B, T, L)

    def encode(self, images: Tensor) -> tuple[Source, Any]:
        """The regions to attend to and the decoder's first state, for ``images (B, 1, H, W)``."""
        annotations = self.encoder(images)  # (B, L, d_hidden)
        mask = annotations.new_ones(annotations.size(0), 1, annotations.size(1), dtype=torch.bool)
        return self.attention.prepare(annotations, mask), self.bridge(annotations, mask)

    def _keep_for_losses(self, alignments: list[Alignment]) -> None:
        """Hard attention's choices (as the translation model keeps them), or soft attention's weights
        for :meth:`attention_penalty`."""
        super()._keep_for_losses(alignments)
        if not self.config.hard:
            self._weights = torch.stack([a.weights for a in alignments], 1)  # (B, T, L)

    def attention_penalty(self, targets: Tensor) -> Tensor:
        """The doubly stochastic regularisation of the last training forward (soft attention; zero for
        hard): ``λ Σ_captions Σ_i (1 - Σ_t α_ti)²`` over the steps that predict a real token of
        ``targets (B, T)``."""
        if self._weights is None:
            return targets.new_zeros((), dtype=torch.float)
        weights, self._weights = self._weights, None
        steps = (targets != self.config.pad_id).unsqueeze(-1)  # (B, T, 1)
        attended = torch.where(steps, weights, 0.0).sum(1)  # (B, L): Σ_t α_ti
        return self.config.doubly_stochastic * (1 - attended).square().sum()
