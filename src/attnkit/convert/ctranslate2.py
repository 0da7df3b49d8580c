"""attnkit's Transformers as CTranslate2 specs (the models CTranslate2 runs), filled directly from our
weights, as CTranslate2's own converters do for OpenNMT-py, fairseq and HF.

- An :class:`EncoderDecoder` becomes a ``TransformerSpec``, which CTranslate2's ``Translator`` runs.
- A :class:`DecoderModel` (GPT-style) becomes a ``TransformerDecoderModelSpec``, which its
  ``Generator`` runs: the decoder of that spec without cross-attention is our encoder layer with a
  causal mask, as ours (see ``models/decoder_only.py``).

Our names -> CTranslate2's: each self-attention keeps Q, K, V stacked in one ``in_proj`` (CTranslate2's
``linear[0]``, the same order); a cross-attention's queries are ``linear[0]`` and its keys and values
stacked ``linear[1]``; the LayerNorm of sub-layer j belongs to that sub-layer in CTranslate2 (before it
with ``norm_first``, after the residual otherwise, as ours). Positions are given as our own table
(sinusoids in the model's layout, or the learned ones), so no reordering is needed; token embeddings are
scaled by √d_model (CTranslate2's ``scale_embeddings``) where the model scales them. CTranslate2 is
imported only here, and only when exporting.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from attnkit.convert.common import (
    require_full_softmax_attention,
    require_paper_embeddings,
    require_plain_output,
)
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import ConversionError
from attnkit.models.decoder_only import DecoderModel
from attnkit.models.seq2seq import EncoderDecoder
from attnkit.nn.embedding import sinusoid_table


def ctranslate2_spec(model: EncoderDecoder | DecoderModel, tokenizer: Tokenizer) -> Any:
    """The CTranslate2 spec holding ``model`` and ``tokenizer``'s vocabulary: a ``TransformerSpec`` for
    an encoder-decoder, a ``TransformerDecoderModelSpec`` for a decoder (GPT-style)."""
    if isinstance(model, EncoderDecoder):
        return _translation_spec(model, tokenizer)
    if isinstance(model, DecoderModel):
        return _generation_spec(model, tokenizer)
    raise ConversionError(f"CTranslate2 runs encoder-decoder and decoder models, not {type(model).__name__}")


class _Weights:
    """The model's weights as float32 arrays, put into a spec by our names. Copies: CTranslate2 may change
    its arrays in place (quantising), which must not touch the model."""

    def __init__(self, model: nn.Module) -> None:
        self.arrays = {
            name: t.detach().float().cpu().numpy().copy() for name, t in model.state_dict().items()
        }

    def linear(self, target: Any, name: str, rows: slice = slice(None)) -> None:
        target.weight = np.ascontiguousarray(self.arrays[f"{name}.weight"][rows])
        if f"{name}.bias" in self.arrays:
            target.bias = np.ascontiguousarray(self.arrays[f"{name}.bias"][rows])

    def norm(self, target: Any, name: str) -> None:
        target.gamma, target.beta = self.arrays[f"{name}.weight"], self.arrays[f"{name}.bias"]

    def positions(self, config: Any, name: str) -> np.ndarray:
        """The position table: the sinusoids in the model's layout, or the learned ``name``."""
        if config.positions == "sinusoidal":
            return sinusoid_table(config.max_len, config.d_model, config.sinusoid_layout).numpy()
        return self.arrays[f"{name}.weight"]

    def self_attention_layer(self, target: Any, ours: str) -> None:
        """Self-attention and feed-forward: an encoder layer, or a decoder model's layer (the same)."""
        self.linear(target.self_attention.linear[0], f"{ours}.self_attn.in_proj")
        self.linear(target.self_attention.linear[1], f"{ours}.self_attn.out_proj")
        self.norm(target.self_attention.layer_norm, f"{ours}.sublayer.0.norm")
        self.feed_forward(target.ffn, ours, 1)

    def feed_forward(self, target: Any, ours: str, sublayer: int) -> None:
        self.linear(target.linear_0, f"{ours}.feed_forward.w_1")
        self.linear(target.linear_1, f"{ours}.feed_forward.w_2")
        self.norm(target.layer_norm, f"{ours}.sublayer.{sublayer}.norm")


def _activation(config: Any) -> Any:
    from ctranslate2.specs import common_spec

    activations = {
        "relu": common_spec.Activation.RELU,
        "gelu": common_spec.Activation.GELU,
        "gelu_tanh": common_spec.Activation.GELUTanh,
    }
    if config.activation not in activations:
        raise ConversionError(
            f"CTranslate2: activation {config.activation!r} is not one of {list(activations)}"
        )
    return activations[config.activation]


def _vocabulary_and_specials(spec: Any, tokenizer: Tokenizer) -> list[str]:
    """Our tokenizer's tokens, id by id, and its special tokens set in the spec's config."""
    names, s = tokenizer.hf.id_to_token, tokenizer.specials
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = (
        names(s.unk),
        names(s.bos),
        names(s.eos),
    )
    return [names(i) for i in range(tokenizer.vocab_size)]


def _translation_spec(model: EncoderDecoder, tokenizer: Tokenizer) -> Any:
    from ctranslate2.specs import transformer_spec

    c = model.config
    require_full_softmax_attention(c, "CTranslate2")
    require_plain_output(c, "CTranslate2")
    require_paper_embeddings(c, "CTranslate2")
    spec = transformer_spec.TransformerSpec.from_config(
        (c.encoder_layers, c.decoder_layers), c.h, pre_norm=c.norm_first, activation=_activation(c)
    )
    w = _Weights(model)
    for side, name in ((spec.encoder, "src"), (spec.decoder, "tgt")):
        (side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings).weight = w.arrays[
            f"{name}_embed.lut.weight"
        ]
        side.scale_embeddings = True
        side.position_encodings.encodings = w.positions(c, f"{name}_pos")
    if c.norm_first:  # pre-LN stacks end with a LayerNorm
        w.norm(spec.encoder.layer_norm, "encoder.norm")
        w.norm(spec.decoder.layer_norm, "decoder.norm")
    for i, layer in enumerate(spec.encoder.layer):
        w.self_attention_layer(layer, f"encoder.layers.{i}")
    d = c.d_model
    for i, layer in enumerate(spec.decoder.layer):
        ours = f"decoder.layers.{i}"
        w.linear(layer.self_attention.linear[0], f"{ours}.self_attn.in_proj")
        w.linear(layer.self_attention.linear[1], f"{ours}.self_attn.out_proj")
        w.norm(layer.self_attention.layer_norm, f"{ours}.sublayer.0.norm")
        w.linear(layer.attention.linear[0], f"{ours}.src_attn.in_proj", slice(0, d))  # queries
        w.linear(layer.attention.linear[1], f"{ours}.src_attn.in_proj", slice(d, 3 * d))  # keys and values
        w.linear(layer.attention.linear[2], f"{ours}.src_attn.out_proj")
        w.norm(layer.attention.layer_norm, f"{ours}.sublayer.1.norm")
        w.feed_forward(layer.ffn, ours, 2)
    w.linear(spec.decoder.projection, "generator.proj")

    vocabulary = _vocabulary_and_specials(spec, tokenizer)
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    spec.config.decoder_start_token = spec.config.bos_token  # attnkit's decoder starts from <s>
    spec.config.add_source_bos, spec.config.add_source_eos = False, False  # </s> is added when translating
    spec.config.layer_norm_epsilon = c.layer_norm_eps
    return spec


def _generation_spec(model: DecoderModel, tokenizer: Tokenizer) -> Any:
    """A GPT-style decoder: embeddings (scaled or not) + positions, N causal layers (pre- or post-LN; a
    final LayerNorm with pre-LN), the output projection (tied or not, with or without a bias)."""
    from ctranslate2.specs import transformer_spec

    c = model.config
    require_full_softmax_attention(c, "CTranslate2")
    spec = transformer_spec.TransformerDecoderModelSpec.from_config(
        c.layers, c.h, pre_norm=c.norm_first, activation=_activation(c)
    )
    w, decoder = _Weights(model), spec.decoder
    decoder.embeddings.weight = w.arrays["embed.lut.weight"]
    decoder.scale_embeddings = c.scale_embeddings
    decoder.position_encodings.encodings = w.positions(c, "positions")
    if c.norm_first:
        w.norm(decoder.layer_norm, "decoder.norm")
    for i, layer in enumerate(decoder.layer):
        w.self_attention_layer(layer, f"decoder.layers.{i}")
    w.linear(decoder.projection, "generator.proj")
    spec.register_vocabulary(_vocabulary_and_specials(spec, tokenizer))
    spec.config.layer_norm_epsilon = c.layer_norm_eps
    return spec
