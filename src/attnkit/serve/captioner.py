"""An image captioner as the server runs it: uploaded images captioned as ``attnkit predict --image``
captions image files (the task's ``infer``, the run's decode settings), and the caption explorer's page
(viz/caption_explorer.py) for an uploaded image.

An upload is checked from its header alone (PNG or JPEG, of the model's size: data/images.py), so that a
file declaring a huge image costs nothing, and decoded on the batcher's worker. An image costs the batch
its regions (``(image_size / 8)²``, 36 for a 48-pixel scene), as a sentence costs its tokens:
``--max-batch-tokens`` bounds both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from attnkit.data.images import ImageFile, checked_image
from attnkit.serve.served import ReadsUploads, form_for_uploads


@dataclass
class ServedCaptioner(ReadsUploads):
    reading: ClassVar[str] = "images"
    field: ClassVar[str] = "image"
    example: ClassVar[str] = "curl -F image=@scene.png"
    output: ClassVar[str] = "caption"
    unit: ClassVar[str] = "regions"
    reads: ClassVar[str] = "captions images"
    asks: ClassVar[str] = "upload an image to see where the captioner looks as it writes each word"
    upload_form: ClassVar[str] = form_for_uploads("image", "image/png,image/jpeg", "caption it")

    @property
    def image_size(self) -> int:
        """The side of the images the model reads, in pixels."""
        return self.config.model.image_size

    def read_upload(self, data: bytes, name: str) -> ImageFile:
        """An uploaded image, its header checked: PNG or JPEG of the model's size."""
        return checked_image(data, name, self.image_size)

    def cost(self, upload: ImageFile) -> int:
        """The regions the captioner attends to."""
        return self.model.config.regions

    def decode_input(self, upload: ImageFile) -> Tensor:
        """``(H, W)`` grey levels."""
        return upload.grey()

    def explore_upload(self, upload: ImageFile, name: str, base: str) -> str:
        """The caption explorer's page for an uploaded image, with the upload form on top."""
        from attnkit.viz.caption_explorer import caption_page, caption_view

        image = self.decoded(upload)
        view = caption_view(self.model, self.tokenizer, self.config.decode, image, self.checkpoint.name)
        form = self.upload_form.format(action=base)
        return caption_page(image, [view], f"caption of {name} by {self.checkpoint.name}", form)
