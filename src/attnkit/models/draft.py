"""A shallow draft decoder for speculative decoding (``decode.speculative=shallow``).

Kasai et al. (2021) found that a deep encoder with a *one-layer* decoder translates nearly as well as
the full model: the decoder's depth buys little that the encoder has not already done. That makes one
layer a good guesser of the full model's next tokens, for a third of the decoder's work and with the
encoder's memory already computed. The draft here is one decoder layer of the model's own shape
(and, with pre-LN, a final LayerNorm) between the model's target embedding and its output layer
(and copy mechanism): it shares the encoder, the embeddings and the generator, so it adds only the
one layer's weights, saved beside the model's in the checkpoint (``draft.safetensors``).

Loaded with the model, it is made ready with it, in the same precision (``decode.precision``): its
float32 weights cost more to read between the model's steps (a draft step of the 6-minute Multi30k
model, one thread, between checks: 1.5 ms in float32, 1.2 ms in bf16).

It starts as a copy of the model's first decoder layer (which reads the embeddings, as the draft
does) and learns to predict the model's own greedy outputs (sequence-level distillation, Kim & Rush,
2016: ``attnkit distill-draft``, train/distill_draft.py). A draft never changes the output, only how
many steps it takes (decode/speculative.py).

A GPT's draft (:class:`ShallowCausalDraft`) is alike: one layer of the model's own shape between its
embeddings and positions and its output layer (and final LayerNorm), starting as a copy of its first
layer.
"""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn

from attnkit.attention.multihead import KVCache
from attnkit.models.decoder_only import DecoderModel
from attnkit.models.decoding import CausalDecoding
from attnkit.models.layers import encoder_layer
from attnkit.models.seq2seq import EncoderDecoder, decoder_stack
from attnkit.nn.pointer import PointerGenerator
from attnkit.nn.transformer import Decoder, DecoderCache, Encoder

DRAFT_FILE = "draft.safetensors"  # beside model.safetensors in a checkpoint folder


class _Held(nn.Module):
    """A draft's one layer, ``decoder`` (a stack of one, built as ``model``'s and starting as a copy of
    its first layer), beside the model it drafts for: held, not owned (a tuple is not a submodule, so
    neither the model's weights nor its modes are the draft's; ``state_dict`` has ``decoder.*``
    only)."""

    def __init__(self, model: nn.Module, decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder
        self.decoder.load_state_dict(_first_layer(model.decoder.state_dict()))
        self._model = (model,)
        self.config = model.config


class ShallowDraft(_Held):
    """One decoder layer that decodes as ``model`` does (``EncoderDecoderModel``, so that
    ``Seq2SeqDecoding`` steps it like the model): the model's memory, embeddings and generator, its own
    layer."""

    decoder: Decoder

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__(model, decoder_stack(dataclasses.replace(model.config, decoder_layers=1)))

    @property
    def model(self) -> EncoderDecoder:
        return self._model[0]

    @property
    def pointer(self) -> PointerGenerator | None:
        return self.model.pointer

    def source_mask(self, src: Tensor) -> Tensor:
        return self.model.source_mask(src)

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        return self.model.encode(src, src_mask)

    def decode(
        self,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt: Tensor,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """The draft's states ``(B, T, d_model)``: as ``EncoderDecoder.decode``, through its one layer."""
        return self.model.decode(memory, src_mask, tgt, tgt_mask, cache, positions, decoder=self.decoder)

    def new_cache(self) -> DecoderCache:
        return DecoderCache(1)

    def generator(self, hidden: Tensor) -> Tensor:
        return self.model.generator(hidden)

    def step_weights(self) -> dict[str, Tensor]:
        """The weights its decoding steps read, by name: the model's it decodes through, and its layer's
        (a compiled step of the draft freezes them all)."""
        own = {f"draft.{name}": weight for name, weight in self.state_dict().items()}
        return {**self.model.step_weights(), **own}

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """``src (B, S)``, ``tgt (B, T)`` -> the draft's logits ``(B, T, V)`` (with the copy mechanism its
        log-probabilities): ``EncoderDecoder.forward`` through its one layer, what distillation trains
        (with the model's weights frozen: the draft learns its layer alone)."""
        return self.model(src, tgt, decoder=self.decoder)


class ShallowCausalDraft(_Held):
    """A GPT's draft (``CausalModel``, so that ``CausalDecoding`` steps it like the model): the model's
    embeddings, positions and output layer, one layer of its own."""

    decoder: Encoder

    def __init__(self, model: DecoderModel) -> None:
        c = model.config
        super().__init__(model, Encoder([encoder_layer(c)], c.d_model, c.norm_first, c.layer_norm_eps))

    @property
    def model(self) -> DecoderModel:
        return self._model[0]

    def forward(
        self,
        ids: Tensor,
        key_valid: Tensor | None = None,
        positions: Tensor | None = None,
        caches: list[KVCache] | None = None,
        project: bool = True,
    ) -> Tensor:
        """The draft's logits ``(B, T, V)``: ``DecoderModel.forward`` through its one layer (what
        distillation trains, the model's weights frozen, and what its decoding steps)."""
        return self.model(ids, key_valid, positions, caches, project, decoder=self.decoder)

    def new_caches(self) -> list[KVCache]:
        return [KVCache()]

    def decoding(self, prompt_valid: Tensor, use_cache: bool = True) -> CausalDecoding:
        """Step-by-step decoding after left-padded prompts, as ``DecoderModel.decoding``."""
        return CausalDecoding(self, prompt_valid, use_cache)


def draft_for(model: nn.Module) -> ShallowDraft | ShallowCausalDraft:
    """A new draft for ``model`` (a copy of its first layer): an encoder-decoder's or a GPT's."""
    if isinstance(model, DecoderModel):
        return ShallowCausalDraft(model)
    if isinstance(model, EncoderDecoder):
        return ShallowDraft(model)
    raise TypeError(f"no draft decoder for a {type(model).__name__}")


def _first_layer(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """A decoder's weights cut to its first layer's (and its final norm's, with pre-LN)."""
    return {
        name: tensor
        for name, tensor in weights.items()
        if name.startswith("layers.0.") or not name.startswith("layers.")
    }
