"""An image captioner as the server runs it: uploaded images captioned as ``attnkit predict --image``
captions image files (the task's ``infer``, the run's decode settings), and the caption explorer's page
(viz/caption_explorer.py) for an uploaded image.

An image costs the batch its regions (``(image_size / 8)²``, 36 for a 48-pixel scene), as a sentence
costs its tokens: ``--max-batch-tokens`` bounds both.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from attnkit.checkpoint.folder import resolve_checkpoint
from attnkit.loading import load_for_inference
from attnkit.models import archs
from attnkit.serve.served import AttnkitModel
from attnkit.tasks import task_of


@dataclass
class ServedCaptioner(AttnkitModel):
    dialects: ClassVar[tuple[str, ...]] = ("images",)

    @property
    def image_size(self) -> int:
        """The side of the images the model reads, in pixels."""
        return self.config.model.image_size

    @property
    def regions(self) -> int:
        """What one image costs a batch: the regions the captioner attends to."""
        return self.model.config.regions

    def run(self, images: list[Tensor], settings: Hashable) -> list[str]:
        """Each image's caption (``(H, W)`` grey levels, of the model's size), as ``attnkit predict``."""
        return task_of(self.config).infer(self.model, self.tokenizer, self.config, images, self.device)

    def explore(self, text: str, target: str | None, base: str, limit: int) -> tuple[str, int]:
        """A captioner reads images: the page asks for one (``POST`` to the same address)."""
        from attnkit.viz.explorer import message_page

        said = "upload an image to see where the captioner looks as it writes each word"
        if text.strip():
            said = "this model captions images, it reads no text: " + said
        return message_page(said, base, IMAGE_FORM), 200 if not text.strip() else 400

    def explore_image(self, image: Tensor, name: str, base: str) -> str:
        """The caption explorer's page for ``image``, with the upload form on top."""
        from attnkit.viz.caption_explorer import caption_page, caption_view

        view = caption_view(self.model, self.tokenizer, self.config.decode, image, self.checkpoint.name)
        form = IMAGE_FORM.format(action=base)
        return caption_page(image, [view], f"caption of {name} by {self.checkpoint.name}", form)


IMAGE_FORM = """<form method="post" action="{action}" enctype="multipart/form-data" id="ask">
<input type="file" name="image" accept="image/*">
<button type="submit">caption it</button></form>"""


def load_captioner(ckpt: str | Path, overrides: list[str], *, device: str = "cpu") -> ServedCaptioner:
    """A captioner's checkpoint (or run directory: its best) ready to serve."""
    checkpoint = resolve_checkpoint(ckpt)
    model, tokenizer, config = load_for_inference(
        checkpoint, device, arch=archs(reading="images", writing="text"), overrides=overrides
    )
    return ServedCaptioner(checkpoint, tokenizer, model, config, torch.device(device))
