"""Image captioning on generated digit scenes (``data.task: captions``): the task of the Show-Attend-Tell
captioner (``model.arch: show-attend-tell``, models/captioner.py), soft or hard attention, and of the
Transformer captioner (``model.arch: caption-transformer``, models/caption_transformer.py).

The data are generated (data/digit_scenes.py): ``data.n_train`` training scenes, new ones every epoch
(drawn from the run's seed and the epoch, so a resumed run sees the same ones), and ``data.n_valid``
validation scenes and as many test scenes, from digits never seen in training. The captions' words are
a fixed list, so the word tokenizer is learned from that list, the same for every run. A batch is
``train.batch_size`` scenes, their pixels scaled to [0, 1] and their captions as ``<s> y`` and ``y </s>``;
the loss is the label-smoothed cross-entropy of the caption (summed over its tokens), plus (the RNN
captioner's) soft attention's doubly stochastic regularisation or hard attention's REINFORCE term.
Validation reports loss and perplexity, and BLEU-4 and exact match of greedy captions; the test adds
how often the attention, as a word names a digit, is on that digit (:func:`attention_on_digits`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from attnkit.config import RunConfig
from attnkit.data.batching import consecutive, pad
from attnkit.data.cluttered_digits import DIGIT
from attnkit.data.digit_scenes import CANVAS, CELL_WORDS, Scenes, digit_scenes
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.captions import attention_while_writing, caption
from attnkit.metrics import bleu, exact_match
from attnkit.models import unwrap
from attnkit.models.captioner import DOWNSAMPLING, Captioner
from attnkit.tasks.image_classification import check_image_sizes
from attnkit.tasks.losses import generative_loss
from attnkit.tasks.protocol import Given, Scoring
from attnkit.tasks.validation import validation_loss


@dataclass
class CaptionBatch:
    images: Tensor  # (B, 1, H, W) in [0, 1]
    tgt_in: Tensor  # (B, T): <s> + caption
    tgt_out: Tensor  # (B, T): caption + </s>
    n_tokens: int  # caption tokens that count towards the loss

    def to(self, device: torch.device | str) -> CaptionBatch:
        return CaptionBatch(
            self.images.to(device), self.tgt_in.to(device), self.tgt_out.to(device), self.n_tokens
        )


def pixels(images: Tensor) -> Tensor:
    """8-bit grey images ``(B, H, W)`` as the captioner reads them: ``(B, 1, H, W)`` in [0, 1]."""
    return images.unsqueeze(1).float() / 255


def caption_batch(scenes: Scenes, indices: list[int], tokenizer: Tokenizer) -> CaptionBatch:
    ids = tokenizer.encode_batch([scenes.captions[i] for i in indices])
    specials = tokenizer.specials
    return CaptionBatch(
        images=pixels(scenes.images[indices]),
        tgt_in=pad([[specials.bos, *t] for t in ids], specials.pad),
        tgt_out=pad([[*t, specials.eos] for t in ids], specials.pad),
        n_tokens=sum(len(t) + 1 for t in ids),
    )


def split_scenes(config: RunConfig, split: str, epoch: int = 0) -> Scenes:
    """The generated ``train`` scenes of an epoch, or the ``valid``/``test`` ones (``n_valid`` each)."""
    d, seed = config.data, config.train.seed
    if split == "train":
        return digit_scenes(split, d.n_train, [seed, epoch])
    return digit_scenes(split, d.n_valid, seed + {"valid": 1, "test": 2}[split])


def caption_tokenizer() -> Tokenizer:
    """One token per caption word: learned from the fixed list of them."""
    return Tokenizer.train("word", [" ".join(CELL_WORDS)], vocab_size=len(CELL_WORDS) + 16)


@torch.no_grad()
def attention_on_digits(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    scenes: Scenes,
    captions: list[str],
    device: torch.device | str,
) -> float:
    """How often the attention is on the digit a word names: for each digit word of each caption (the
    k-th names the scene's k-th digit in reading order), whether the centre of the most attended region
    at the step that wrote it lies within that digit's 16×16 square. Over the digits the captions name
    (a caption naming more digits than its scene holds counts the extra ones as misses)."""
    grid = unwrap(model).config.image_size // DOWNSAMPLING
    hits, named = 0, 0
    for group in consecutive(len(scenes), 64):
        images = pixels(scenes.images[group]).to(device)
        ids, weights = attention_while_writing(unwrap(model), tokenizer, images, [captions[i] for i in group])
        for row, i in enumerate(group):
            steps = [t for t, word in enumerate(tokenizer.tokens(ids[row])) if word.isdigit()]
            named += len(steps)
            digits = zip(scenes.corners[i].tolist(), scenes.digits[i].tolist(), strict=True)
            corners = [corner for corner, digit in digits if digit >= 0]
            for t, (top, left) in zip(steps, corners, strict=False):  # the k-th word: the k-th digit
                y, x = region_centre(int(weights[row, t].argmax()), grid)  # weights (B, T, L)
                hits += top <= y < top + DIGIT and left <= x < left + DIGIT
    return hits / max(named, 1)


def region_centre(region: int, grid: int) -> tuple[float, float]:
    """The pixel (row, column) at the centre of region ``region`` of a ``grid``×``grid`` of regions,
    numbered row by row as the encoder flattens them."""
    row, col = divmod(region, grid)
    return row * DOWNSAMPLING + DOWNSAMPLING / 2, col * DOWNSAMPLING + DOWNSAMPLING / 2


class CaptioningTask:
    """The trainer's view of digit scenes: batches, loss and validation (see the module docstring)."""

    unit: ClassVar[str] = "target tokens"
    scoring: ClassVar[Scoring] = Scoring(
        files=(), asks="it is evaluated on its own generated test scenes", decodes=True, holder="a captioner"
    )

    def __init__(self, config: RunConfig, tokenizer: Tokenizer | None, echo: Callable[[str], None]) -> None:
        self.config = config
        config.model.image_size = CANVAS  # saved with the run
        self.tokenizer = tokenizer or caption_tokenizer()
        self.valid = split_scenes(config, "valid")
        self.train: tuple[int, Scenes] | None = None  # (epoch, its scenes)
        d = config.data
        echo(
            f"training scenes: {d.n_train:,} an epoch, new each epoch; validation: {len(self.valid):,} "
            f"({CANVAS}×{CANVAS}, 2–4 digits each); {self.tokenizer.vocab_size} tokens: the caption words, "
            "the specials"
        )

    def epoch_batches(self, epoch: int) -> list[tuple[int, list[int]]]:
        """This epoch's batches, ``(epoch, scene indices)`` (the scenes are drawn in random order)."""
        size = self.config.train.batch_size
        return [(epoch, group) for group in consecutive(self.config.data.n_train, size)]

    def make_batch(self, description: tuple[int, list[int]]) -> CaptionBatch:
        epoch, indices = description
        if self.train is None or self.train[0] != epoch:
            self.train = epoch, split_scenes(self.config, "train", epoch)
        return caption_batch(self.train[1], indices, self.tokenizer)

    def loss(self, model: torch.nn.Module, batch: CaptionBatch) -> tuple[Tensor, Tensor]:
        """Summed label-smoothed loss and NLL of the captions' tokens, plus hard attention's REINFORCE
        term (rewarded with each token's log-likelihood) or soft attention's doubly stochastic one."""
        pad_id = self.tokenizer.specials.pad
        loss, nll = generative_loss(
            model, (batch.images, batch.tgt_in), batch.tgt_out, self.config.train.label_smoothing, pad_id
        )
        captioner = unwrap(model)
        if captioner.training and isinstance(captioner, Captioner):  # the RNN captioner's attention terms
            loss = (
                loss + captioner.policy_loss(-nll, batch.tgt_out) + captioner.attention_penalty(batch.tgt_out)
            )
        return loss, nll.sum()

    def validate(self, model: torch.nn.Module, device: torch.device, autocast: Callable) -> dict[str, float]:
        """Loss and perplexity, then BLEU-4 and exact match of greedy captions."""
        size = self.config.train.batch_size
        groups = consecutive(len(self.valid), size)
        batches = (caption_batch(self.valid, group, self.tokenizer) for group in groups)
        scores = validation_loss(self.loss, model, batches, device, autocast)
        plain = dataclasses.replace(self.config.decode, speculative="none")  # (no draft while training)
        found = caption(unwrap(model), self.tokenizer, pixels(self.valid.images), plain,
                        beam_size=1, device=device)  # fmt: skip
        return {**scores, "valid_bleu": bleu(found, self.valid.captions).score,
                "valid_accuracy": exact_match(found, self.valid.captions)}  # fmt: skip

    @classmethod
    def infer(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        config: RunConfig,
        inputs: Sequence[Tensor],
        device: torch.device | str,
        where: str = "input",
        first: int = 1,
    ) -> list[str]:
        """Each image's caption, by the run's decode settings; an image is ``(side, side)`` 8-bit grey
        levels, 0 = black, as the task's scenes."""
        assert tokenizer is not None
        check_image_sizes(inputs, config.model.image_size, where, first)
        return caption(model, tokenizer, pixels(torch.stack(list(inputs))), config.decode, device=device)

    @classmethod
    def score(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        config: RunConfig,
        given: Given,
        device: torch.device | str,
    ) -> list[str]:
        """BLEU-4 and exact match on the task's generated test scenes (digits never seen in training), and
        how often the attention is on the digit being named."""
        assert tokenizer is not None
        test = split_scenes(config, "test")
        began = time.perf_counter()
        found = caption(
            model, tokenizer, pixels(test.images), config.decode, beam_size=given.beam, device=device
        )
        on_digit = attention_on_digits(model, tokenizer, test, found, device)
        exact = exact_match(found, test.captions)
        return [
            f"BLEU {bleu(found, test.captions).score:.2f}, exact match {exact:.4f}, attention on the named "
            f"digit {on_digit:.4f}, on {len(test)} test scenes ({time.perf_counter() - began:.1f} s)"
        ]
