"""An image captioner in the modern form: the Transformer's decoder writing a caption while it attends
to the regions of an image (as the vision-encoder-decoder models since Show, Attend and Tell do; the
regions here are those of the Show-Attend-Tell captioner, models/captioner.py).

The **encoder** reads pixels, not tokens: the captioner's small CNN turns a ``image_size``² grey image
into ``L = (image_size / 8)²`` regions of ``d_model`` features, each with a learned embedding of its
place in the grid (a vision Transformer's position embedding), and ``encoder_layers`` layers of the
paper's encoder let every region see the others (self-attention over the regions). That is the memory.

The **decoder** is the paper's (Vaswani et al. §3.1), unchanged: the caption so far, embedded ×√d_model
with sinusoidal positions, goes through ``decoder_layers`` layers of masked self-attention, multi-head
attention over the regions and a feed-forward network; the output projection is tied to the word
embedding. Training, the KV cache, greedy and beam search are the translation model's
(:class:`~attnkit.models.decoding.Seq2SeqDecoding`): the captioner offers the same ``encode``,
``decode``, ``source_mask`` and ``generator``.

Where the RNN captioner has one attention a step, this one has ``decoder_layers × h`` heads;
:meth:`CaptionTransformer.alignments` shows the last layer's heads averaged, the map a caption's word
is written from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnkit.attention.recording import recording
from attnkit.models.captioner import DOWNSAMPLING, ImageEncoder, check_image_fields
from attnkit.models.config import BaseTransformerConfig
from attnkit.models.decoding import Seq2SeqDecoding
from attnkit.models.seq2seq import EncoderDecoder, Generator, decoder_stack, encoder_stack
from attnkit.nn.embedding import Embeddings, positional_encoding


@dataclass
class CaptionTransformerConfig(BaseTransformerConfig):
    """A Transformer captioner (``arch: caption-transformer``): the paper's fields for both stacks,
    the image fields of the RNN captioner."""

    ARCH: ClassVar[str] = "caption-transformer"
    LAYER_FIELDS: ClassVar[tuple[str, ...]] = ("encoder_layers", "decoder_layers")
    arch: str = "caption-transformer"
    encoder_layers: int = 2  # self-attention layers over the regions
    decoder_layers: int = 2
    d_model: int = 128
    d_ff: int = 512
    h: int = 4
    tie_output: bool = True  # the output projection is the word embedding (§3.4)
    scale_embeddings: bool = True  # words embedded ×√d_model (§3.4)
    image_size: int = 48  # the images' side in pixels (set from the data)
    channels: int = 64  # the convolutions' width (the first has half)
    max_len: int = 40  # longest caption the search makes (and the positions the decoder has)

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "caption-transformer-small": {},
        "caption-transformer-tiny": dict(  # tests
            encoder_layers=1, decoder_layers=1, d_model=32, d_ff=64, h=4, channels=8, dropout=0.0
        ),
    }

    @property
    def regions(self) -> int:
        """``L``: the regions a caption attends to."""
        return (self.image_size // DOWNSAMPLING) ** 2

    def __post_init__(self) -> None:
        super().__post_init__()
        check_image_fields(self)


class CaptionTransformer(nn.Module):
    """``forward(images, tgt) -> logits (B, T, V)``; ``alignments(images, tgt) -> (B, T, L)``;
    ``decoding(images)`` for search (see the module docstring)."""

    # The target side is the translation model's, read the same way: embed, decode, cache, initialise.
    decode = EncoderDecoder.decode
    new_cache = EncoderDecoder.new_cache
    _init_weights = EncoderDecoder._init_weights
    pointer = None  # no copying: a caption's words come from the vocabulary only
    copies = False

    def __init__(self, config: CaptionTransformerConfig, vocab_size: int) -> None:
        super().__init__()
        c = self.config = config
        self.regions = ImageEncoder(c.channels, c.d_model, c.regions)
        self.region_dropout = nn.Dropout(c.dropout)
        self.encoder = encoder_stack(c)
        self.decoder = decoder_stack(c)
        self.tgt_embed = Embeddings(vocab_size, c.d_model, c.pad_id, c.scale_embeddings)
        self.tgt_pos = positional_encoding(c.positions, c.d_model, c.dropout, c.max_len, c.sinusoid_layout)
        self.tgt_norm = None  # (the translation model's BERT-style embedding option; not here)
        self.generator = Generator(c.d_model, vocab_size)
        self._init_weights()
        # a smaller captioner whose guesses greedy search checks (decode/captions.py), set where one is loaded
        self.draft: nn.Module | None = None

    @property
    def output_layer(self) -> nn.Linear:
        """The pre-softmax linear map (the word embedding, tied)."""
        return self.generator.proj

    def source_mask(self, images: Tensor) -> Tensor:
        """Every region may be attended to: ``(B, 1, L)`` of True."""
        return torch.ones(images.size(0), 1, self.config.regions, dtype=torch.bool, device=images.device)

    def encode(self, images: Tensor, mask: Tensor | None = None) -> Tensor:
        """``images (B, 1, H, W)`` -> memory ``(B, L, d_model)``: the regions, each having seen the others."""
        regions = self.region_dropout(self.regions(images))  # (B, L, d_model)
        return self.encoder(regions, mask)

    def forward(self, images: Tensor, tgt: Tensor, project: bool = True) -> Tensor:
        """``images (B, 1, H, W)``, ``tgt (B, T)`` (``<s>`` + caption) -> logits ``(B, T, V)``, or with
        ``project=False`` the decoder's states ``(B, T, d_model)`` (for the chunked loss)."""
        memory = self.encode(images)
        hidden = self.decode(memory, None, tgt)  # every region visible: no source mask
        return self.generator(hidden) if project else hidden

    @torch.no_grad()
    def alignments(self, images: Tensor, tgt: Tensor) -> Tensor:
        """The last decoder layer's attention over the regions at each step, its heads averaged:
        ``(B, T, L)``, regions row by row of the grid (as the RNN captioner's)."""
        attends = self.decoder.layers[-1].src_attn
        with recording([attends]) as recorded:
            self(images, tgt)
        return recorded[attends].mean(1)  # (B, h, T, L) -> (B, T, L)

    def decoding(self, images: Tensor, use_cache: bool = True) -> Seq2SeqDecoding:
        """Step-by-step decoding of the captions of ``images (N, 1, H, W)`` (encoded once, now)."""
        return Seq2SeqDecoding(self, images, use_cache)
