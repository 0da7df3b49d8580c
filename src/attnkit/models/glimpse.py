"""Hard attention on images: the recurrent attention model (RAM) of Mnih et al. (2014, "Recurrent Models
of Visual Attention"), and a network of the same size that sees the whole image, to compare it with.

RAM never looks at the whole image. At each of ``glimpses`` steps t it

1. takes a **glimpse** ρ(x, l_{t-1}) at location ``l ∈ [-1, 1]²`` (x, y; the canvas spans [-1, 1]):
   ``scales`` square patches centred there, ``patch`` pixels wide, then twice, four times as wide, each
   averaged down to ``patch × patch`` (a retina: sharp in the centre, coarse around it);
2. the **glimpse network** mixes what and where: ``g_t = ReLU(W_g ReLU(W_ρ ρ) + W_l ReLU(W_ℓ l))``;
3. the **core network** updates its state ``h_t = ReLU(W_h h_{t-1} + W_i g_t)`` (Mnih et al.'s rectifier
   core for classification);
4. the **location network** chooses where to look next: ``l_t ~ N(tanh(W_μ h_t), σ²)`` clipped to the
   canvas, a Gaussian of fixed ``σ`` (``location_std``).

After the last glimpse the **action network** classifies from ``h_T``. The first glimpse is at the
centre, where the widest patch gives a coarse view of most of the canvas.

Training (Mnih et al. §4, their "hybrid" loss): the classifier and everything under it learn by
backpropagation of the cross-entropy; the sampled locations cannot be back-propagated through, so the
location network learns by REINFORCE (``nn/reinforce.py``) with reward ``R = 1`` for a right answer and
0 otherwise, against a learned baseline ``b_t = W_b h_t`` fitted to ``R`` by squared error. As in the
widely used re-implementations, the location and baseline networks read ``h_t`` detached: the noisy
REINFORCE gradient trains only the location network, and the core learns what to remember from the
classification loss alone. When evaluating, each location is the Gaussian's mean (no sampling).

``WholeImageClassifier`` is the comparison: a two-hidden-layer ReLU network on all pixels, its width
chosen so that it has about as many parameters as the glimpse model of the same config (``d_hidden``
set by :func:`whole_image_width`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.errors import require_at_least
from attnkit.models.config import _Presets
from attnkit.nn.reinforce import reinforce_loss


@dataclass
class GlimpseConfig(_Presets):
    """The recurrent attention model (``arch: glimpse``); defaults sized for 40×40 cluttered digits."""

    ARCH: ClassVar[str] = "glimpse"
    arch: str = "glimpse"
    glimpses: int = 6  # T: how many glimpses before answering
    patch: int = 8  # g_w: pixels across the sharpest patch (and every patch after averaging down)
    scales: int = 3  # k: patches per glimpse, each twice as wide as the one before
    d_glimpse: int = 128  # the "what" and "where" layers of the glimpse network
    d_hidden: int = 256  # g_t and the core state h_t
    location_std: float = 0.15  # σ of the location policy, in canvas units ([-1, 1] spans the canvas)
    image_size: int = 40  # set from the data (data.canvas)
    num_labels: int = 10  # set from the data

    PRESETS: ClassVar[dict[str, dict]] = {"ram": {}, "ram-tiny": {"d_glimpse": 16, "d_hidden": 32}}

    @property
    def d_model(self) -> int:
        """The width the Noam schedule scales by: the core state's."""
        return self.d_hidden

    def __post_init__(self) -> None:
        for name in ("glimpses", "patch", "scales", "d_glimpse", "d_hidden", "image_size", "num_labels"):
            require_at_least(f"model.{name}", getattr(self, name), 1)
        require_at_least("model.location_std", self.location_std, 0, strictly=True)


@dataclass
class WholeImageConfig(_Presets):
    """A ReLU network on every pixel (``arch: whole-image``), the comparison for the glimpse model."""

    ARCH: ClassVar[str] = "whole-image"
    arch: str = "whole-image"
    d_hidden: int = 0  # 0: as many parameters as the default glimpse model (whole_image_width)
    image_size: int = 40  # set from the data
    num_labels: int = 10  # set from the data

    PRESETS: ClassVar[dict[str, dict]] = {"mlp": {}}

    @property
    def d_model(self) -> int:
        return self.width

    @property
    def width(self) -> int:
        return self.d_hidden or whole_image_width(
            GlimpseConfig(image_size=self.image_size, num_labels=self.num_labels)
        )

    def __post_init__(self) -> None:
        for name in ("d_hidden", "image_size", "num_labels"):
            require_at_least(f"model.{name}", getattr(self, name), 0 if name == "d_hidden" else 1)


def patch_grid(centres: Tensor, side: int, H: int, W: int) -> Tensor:
    """Where ``grid_sample`` reads a ``side × side`` patch centred on each of ``centres`` ``(B, 2)`` of an
    ``H × W`` canvas: ``(B, side, side, 2)``, (x, y) in the canvas's [-1, 1] coordinates. It is
    ``F.affine_grid`` for a scale-and-shift ``θ = [[side/W, 0, x], [0, side/H, y]]`` (align_corners=False),
    written as the sum it is: affine_grid's batched matrix product was a fifth of a training step."""
    across = (torch.arange(side, dtype=centres.dtype, device=centres.device) * 2 + 1) / side - 1  # (side,)
    xs = centres[:, :1] + across * (side / W)  # (B, side): the patch's pixel centres, left to right
    ys = centres[:, 1:] + across * (side / H)  # (B, side): top to bottom
    return torch.stack(torch.broadcast_tensors(xs[:, None, :], ys[:, :, None]), dim=-1)


def retina(images: Tensor, centres: Tensor, patch: int, scales: int) -> Tensor:
    """The glimpse sensor ρ: for images ``(B, 1, H, W)`` and centres ``(B, 2)`` (x, y in [-1, 1]),
    ``scales`` patches of ``patch · 2^i`` pixels averaged down to ``patch × patch``: ``(B, scales, p, p)``.
    Beyond the canvas is black."""
    _, _, H, W = images.shape
    patches = []
    for i in range(scales):
        side = patch * 2**i  # pixels across this patch
        grid = patch_grid(centres, side, H, W)  # (B, side, side, 2)
        sampled = F.grid_sample(images, grid, align_corners=False, padding_mode="zeros")  # (B, 1, side, side)
        patches.append(F.avg_pool2d(sampled, 2**i) if i else sampled)  # (B, 1, patch, patch)
    return torch.cat(patches, dim=1)


class GlimpseClassifier(nn.Module):
    """``forward(images (B, 1, H, W)) -> logits (B, num_labels)``; ``locations`` records where it looked."""

    def __init__(self, config: GlimpseConfig, vocab_size: int | None = None) -> None:
        super().__init__()
        c = self.config = config
        self.what = nn.Linear(c.scales * c.patch**2, c.d_glimpse)  # W_ρ
        self.where = nn.Linear(2, c.d_glimpse)  # W_ℓ
        self.glimpse_what, self.glimpse_where = (
            nn.Linear(c.d_glimpse, c.d_hidden),
            nn.Linear(c.d_glimpse, c.d_hidden),
        )
        self.core = nn.RNNCell(c.d_hidden, c.d_hidden, nonlinearity="relu")  # ReLU(W_i g_t + W_h h_{t-1})
        self.locate = nn.Linear(c.d_hidden, 2)  # μ_t = tanh(W_μ h_t)
        self.baseline = nn.Linear(c.d_hidden, 1)  # b_t = W_b h_t
        self.classify = nn.Linear(c.d_hidden, c.num_labels)
        self.locations: Tensor | None = None  # (B, T, 2) of the last forward: where each glimpse was
        self._choices: tuple[Tensor, Tensor] | None = None  # training: (log π(l_t), b_t), each (B, T - 1)

    def forward(self, images: Tensor) -> Tensor:
        c = self.config
        B = images.size(0)
        location = images.new_zeros(B, 2)  # the first glimpse: the centre
        state = images.new_zeros(B, c.d_hidden)
        locations, log_probs, baselines = [location], [], []
        for t in range(c.glimpses):
            seen = retina(images, location, c.patch, c.scales).flatten(1)  # (B, k·g²)
            what, where = F.relu(self.what(seen)), F.relu(self.where(location))
            g = F.relu(self.glimpse_what(what) + self.glimpse_where(where))
            state = self.core(g, state)
            if t == c.glimpses - 1:
                break  # the last state answers; no location is chosen after it
            mean = torch.tanh(self.locate(state.detach()))  # (B, 2)
            if self.training:
                policy = torch.distributions.Normal(mean, c.location_std)
                sample = policy.sample()
                log_probs.append(policy.log_prob(sample).sum(-1))  # (B,): x and y drawn independently
                baselines.append(self.baseline(state.detach()).squeeze(-1))
                location = sample.clamp(-1, 1)
            else:
                location = mean
            locations.append(location)
        self.locations = torch.stack(locations, 1)  # (B, T, 2)
        if self.training and log_probs:
            self._choices = torch.stack(log_probs, 1), torch.stack(baselines, 1)
        return self.classify(state)

    def policy_loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        """REINFORCE for the last training forward's locations, rewarded 1 for a right answer, against the
        learned baseline, plus the baseline's squared error; summed over the batch (zero if no locations
        were sampled)."""
        if self._choices is None:
            return logits.new_zeros(())
        (log_prob, baseline), self._choices = self._choices, None
        reward = (logits.argmax(-1) == labels).to(baseline.dtype).unsqueeze(1)  # (B, 1): R
        return reinforce_loss(log_prob, reward, baseline) + (baseline - reward).square().sum()


def whole_image_width(glimpse: GlimpseConfig) -> int:
    """The hidden width ``w`` at which the whole-image network (pixels → w → w → labels) has about as many
    parameters as ``glimpse``'s model: the positive root of ``w² + (pixels + labels + 2)·w + labels``
    ``= target``."""
    target = sum(p.numel() for p in GlimpseClassifier(glimpse).parameters())
    b, c = glimpse.image_size**2 + glimpse.num_labels + 2, glimpse.num_labels - target
    return max(1, round((-b + math.sqrt(b * b - 4 * c)) / 2))


class WholeImageClassifier(nn.Module):
    """``forward(images (B, 1, H, W)) -> logits``: two ReLU layers over all the pixels."""

    def __init__(self, config: WholeImageConfig, vocab_size: int | None = None) -> None:
        super().__init__()
        self.config = config
        w = config.width
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(config.image_size**2, w), nn.ReLU(),
                                    nn.Linear(w, w), nn.ReLU(), nn.Linear(w, config.num_labels))  # fmt: skip

    def forward(self, images: Tensor) -> Tensor:
        return self.layers(images)
