"""Image classification on generated cluttered digits (``data.task: cluttered-digits``): the task of the
glimpse model (``model.arch: glimpse``) and of the network that sees the whole image (``whole-image``).

The data are generated (data/cluttered_digits.py): ``data.n_train`` training canvases, new ones every
epoch (drawn from the run's seed and the epoch, so a resumed run sees the same ones), and ``data.n_valid``
validation canvases, of ``data.canvas`` pixels with ``data.clutter`` pieces of clutter, from disjoint
digits. Fresh canvases matter: with 1,297 training digits, a fixed set of canvases is soon memorised (by
either model). A batch is ``train.batch_size`` images scaled to [0, 1]; the loss is the (label-smoothed)
cross-entropy of the digit, summed over images, plus for the glimpse model the REINFORCE term that trains
where it looks. Validation reports the loss and the accuracy. There is no tokenizer: checkpoints hold the
weights and config.json only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.config import RunConfig
from attnkit.data.batching import consecutive
from attnkit.data.cluttered_digits import N_CLASSES, Canvases, cluttered_digits
from attnkit.errors import AttnkitError
from attnkit.models import evaluating, unwrap
from attnkit.tasks.protocol import Given, Scoring
from attnkit.tasks.validation import validation_loss


@dataclass
class ImageBatch:
    images: Tensor  # (B, 1, H, W) in [0, 1]
    labels: Tensor  # (B,)
    n_tokens: int  # images: what the loss is summed over

    def to(self, device: torch.device | str) -> ImageBatch:
        return ImageBatch(self.images.to(device), self.labels.to(device), self.n_tokens)


def image_batch(canvases: Canvases, indices: list[int] | Tensor) -> ImageBatch:
    images = canvases.images[indices].unsqueeze(1).float() / 255  # (B, 1, H, W)
    return ImageBatch(images, canvases.labels[indices], len(indices))


def split_canvases(config: RunConfig, split: str, epoch: int = 0) -> Canvases:
    """The generated ``train`` canvases of an epoch, or the ``valid``/``test`` ones (``n_valid`` each), of
    a run's config."""
    d, seed = config.data, config.train.seed
    if split == "train":
        return cluttered_digits(split, d.n_train, d.canvas, d.clutter, [seed, epoch])
    return cluttered_digits(split, d.n_valid, d.canvas, d.clutter, seed + {"valid": 1, "test": 2}[split])


def check_image_sizes(images: Sequence[Tensor], size: int, where: str, first: int) -> None:
    """A one-line error naming ``where:number`` for the first image that is not ``size × size``."""
    for number, image in enumerate(images, start=first):
        if tuple(image.shape) != (size, size):
            raise AttnkitError(
                f"{where}:{number}: an image of {tuple(image.shape)}; this model reads ({size}, {size})"
            )


@torch.no_grad()
def accuracy(
    model: torch.nn.Module, canvases: Canvases, batch_size: int, device: torch.device | str
) -> float:
    """The share of ``canvases`` whose digit ``model`` names (evaluation mode: no sampled glimpses)."""
    model.eval()
    right = 0
    for group in consecutive(len(canvases), batch_size):
        batch = image_batch(canvases, group).to(device)
        right += (model(batch.images).argmax(-1) == batch.labels).sum().item()
    return right / len(canvases)


class ImageClassificationTask:
    """The trainer's view of cluttered digits: batches, loss and validation (see the module docstring)."""

    unit: ClassVar[str] = "images"
    scoring: ClassVar[Scoring] = Scoring(files=(), asks="it is evaluated on its own generated test images")

    def __init__(self, config: RunConfig, tokenizer: None, echo: Callable[[str], None]) -> None:
        self.config = config
        config.model.image_size, config.model.num_labels = config.data.canvas, N_CLASSES  # saved with the run
        self.valid, self.tokenizer = split_canvases(config, "valid"), None
        self.train: tuple[int, Canvases] | None = None  # (epoch, its canvases)
        d = config.data
        echo(
            f"training images: {d.n_train:,} an epoch, new each epoch; validation: {len(self.valid):,} "
            f"({d.canvas}×{d.canvas}, {d.clutter} pieces of clutter)"
        )

    def epoch_batches(self, epoch: int) -> list[tuple[int, list[int]]]:
        """This epoch's batches, ``(epoch, image indices)``: consecutive runs of ``train.batch_size`` (the
        canvases are drawn in random order already)."""
        return [
            (epoch, group) for group in consecutive(self.config.data.n_train, self.config.train.batch_size)
        ]

    def make_batch(self, description: tuple[int, list[int]]) -> ImageBatch:
        epoch, indices = description
        if self.train is None or self.train[0] != epoch:
            self.train = epoch, split_canvases(self.config, "train", epoch)
        return image_batch(self.train[1], indices)

    def loss(self, model: torch.nn.Module, batch: ImageBatch) -> tuple[Tensor, Tensor]:
        """Summed (label-smoothed) cross-entropy and NLL of the labels, plus the glimpse model's REINFORCE
        term for where it looked."""
        logits = model(batch.images).float()
        loss = F.cross_entropy(
            logits, batch.labels, reduction="sum", label_smoothing=self.config.train.label_smoothing
        )
        policy_loss = getattr(unwrap(model), "policy_loss", None)
        if policy_loss is not None:
            loss = loss + policy_loss(logits.detach(), batch.labels)
        return loss, F.cross_entropy(logits.detach(), batch.labels, reduction="sum")

    def validate(self, model: torch.nn.Module, device: torch.device, autocast: Callable) -> dict[str, float]:
        """Loss and accuracy on the validation canvases."""
        size = self.config.train.batch_size
        right = []  # each batch's count of right answers, read back once at the end

        def loss_and_answers(model: torch.nn.Module, batch: ImageBatch) -> tuple[Tensor, Tensor]:
            logits = model(batch.images).float()
            right.append((logits.argmax(-1) == batch.labels).sum())
            cross_entropy = F.cross_entropy(logits, batch.labels, reduction="sum")
            return cross_entropy, cross_entropy

        batches = (image_batch(self.valid, group) for group in consecutive(len(self.valid), size))
        scores = validation_loss(loss_and_answers, model, batches, device, autocast)
        return {
            "valid_loss": scores["valid_loss"],
            "valid_accuracy": torch.stack(right).sum().item() / len(self.valid),
        }

    @classmethod
    def infer(
        cls,
        model: torch.nn.Module,
        tokenizer: None,
        config: RunConfig,
        inputs: Sequence[Tensor],
        device: torch.device | str,
        where: str = "input",
        first: int = 1,
    ) -> list[str]:
        """Each image's digit, as the model names it (evaluation mode: no sampled glimpses); an image is
        ``(canvas, canvas)`` 8-bit grey levels, 0 = black, as the task's canvases."""
        check_image_sizes(inputs, config.model.image_size, where, first)
        digits = []
        with evaluating(model), torch.no_grad():
            for group in consecutive(len(inputs), config.train.batch_size):
                images = torch.stack([inputs[i] for i in group]).unsqueeze(1).float().to(device) / 255
                digits += model(images).argmax(-1).tolist()  # (B, 1, H, W) -> (B,)
        return [str(digit) for digit in digits]

    @classmethod
    def score(
        cls,
        model: torch.nn.Module,
        tokenizer: None,
        config: RunConfig,
        given: Given,
        device: torch.device | str,
    ) -> list[str]:
        """Accuracy on the task's generated test images: digits never seen in training."""
        test = split_canvases(config, "test")
        began = time.perf_counter()
        score = accuracy(model, test, config.train.batch_size, device)
        return [f"accuracy {score:.4f} on {len(test)} test images ({time.perf_counter() - began:.1f} s)"]
