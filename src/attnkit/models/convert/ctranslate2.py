"""attnkit's EncoderDecoder as a CTranslate2 ``TransformerSpec`` (the model CTranslate2 runs), filled
directly from our weights, as CTranslate2's own converters do for OpenNMT-py and fairseq.

Our names -> CTranslate2's: each self-attention keeps Q, K, V stacked in one ``in_proj`` (CTranslate2's
``linear[0]``, the same order); a cross-attention's queries are ``linear[0]`` and its keys and values
stacked ``linear[1]``; the LayerNorm of sub-layer j belongs to that sub-layer in CTranslate2 (before it
with ``norm_first``, after the residual otherwise, as ours). Positions are given as our own table
(sinusoids in the model's layout, or the learned ones), so no reordering is needed; token embeddings are
scaled by √d_model (CTranslate2's ``scale_embeddings``) as in the paper. CTranslate2 is imported only
here, and only when exporting.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import ConversionError
from attnkit.models.convert.common import (
    require_full_softmax_attention,
    require_paper_embeddings,
    require_plain_output,
)
from attnkit.models.seq2seq import EncoderDecoder
from attnkit.nn.embedding import sinusoid_table


def ctranslate2_spec(model: EncoderDecoder, tokenizer: Tokenizer) -> Any:
    """The ``ctranslate2.specs.TransformerSpec`` holding ``model`` and ``tokenizer``'s vocabulary."""
    from ctranslate2.specs import common_spec, transformer_spec

    c = model.config
    require_full_softmax_attention(c, "CTranslate2")
    require_plain_output(c, "CTranslate2")
    require_paper_embeddings(c, "CTranslate2")
    activations = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    if c.activation not in activations:
        raise ConversionError(f"CTranslate2: activation {c.activation!r} is not relu or gelu")
    spec = transformer_spec.TransformerSpec.from_config(
        (c.encoder_layers, c.decoder_layers), c.h, pre_norm=c.norm_first, activation=activations[c.activation]
    )
    # Copies: CTranslate2 may change its arrays in place (quantising), which must not touch the model.
    weights = {
        name: tensor.detach().float().cpu().numpy().copy() for name, tensor in model.state_dict().items()
    }

    def linear(target: Any, name: str, rows: slice = slice(None)) -> None:
        target.weight = np.ascontiguousarray(weights[f"{name}.weight"][rows])
        if f"{name}.bias" in weights:
            target.bias = np.ascontiguousarray(weights[f"{name}.bias"][rows])

    def norm(target: Any, name: str) -> None:
        target.gamma, target.beta = weights[f"{name}.weight"], weights[f"{name}.bias"]

    if c.positions == "sinusoidal":
        table = sinusoid_table(c.max_len, c.d_model, c.sinusoid_layout).numpy()
        positions = {"src_pos": table, "tgt_pos": table}
    else:
        positions = {name: weights[f"{name}.weight"] for name in ("src_pos", "tgt_pos")}
    for side, embed, pos in ((spec.encoder, "src_embed", "src_pos"), (spec.decoder, "tgt_embed", "tgt_pos")):
        (side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings).weight = weights[
            f"{embed}.lut.weight"
        ]
        side.scale_embeddings = True
        side.position_encodings.encodings = positions[pos]
    if c.norm_first:  # pre-LN stacks end with a LayerNorm
        norm(spec.encoder.layer_norm, "encoder.norm")
        norm(spec.decoder.layer_norm, "decoder.norm")
    for i, layer in enumerate(spec.encoder.layer):
        ours = f"encoder.layers.{i}"
        linear(layer.self_attention.linear[0], f"{ours}.self_attn.in_proj")
        linear(layer.self_attention.linear[1], f"{ours}.self_attn.out_proj")
        norm(layer.self_attention.layer_norm, f"{ours}.sublayer.0.norm")
        _feed_forward(layer.ffn, ours, 1, linear, norm)
    d = c.d_model
    for i, layer in enumerate(spec.decoder.layer):
        ours = f"decoder.layers.{i}"
        linear(layer.self_attention.linear[0], f"{ours}.self_attn.in_proj")
        linear(layer.self_attention.linear[1], f"{ours}.self_attn.out_proj")
        norm(layer.self_attention.layer_norm, f"{ours}.sublayer.0.norm")
        linear(layer.attention.linear[0], f"{ours}.src_attn.in_proj", slice(0, d))  # queries
        linear(layer.attention.linear[1], f"{ours}.src_attn.in_proj", slice(d, 3 * d))  # keys and values
        linear(layer.attention.linear[2], f"{ours}.src_attn.out_proj")
        norm(layer.attention.layer_norm, f"{ours}.sublayer.1.norm")
        _feed_forward(layer.ffn, ours, 2, linear, norm)
    linear(spec.decoder.projection, "generator.proj")

    names = tokenizer.hf.id_to_token
    s = tokenizer.specials
    vocabulary = [names(i) for i in range(tokenizer.vocab_size)]
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = (
        names(s.unk),
        names(s.bos),
        names(s.eos),
    )
    spec.config.decoder_start_token = names(s.bos)  # attnkit's decoder starts from <s>
    spec.config.add_source_bos, spec.config.add_source_eos = False, False  # </s> is added when translating
    spec.config.layer_norm_epsilon = c.layer_norm_eps
    return spec


def _feed_forward(target: Any, ours: str, sublayer: int, linear: Any, norm: Any) -> None:
    linear(target.linear_0, f"{ours}.feed_forward.w_1")
    linear(target.linear_1, f"{ours}.feed_forward.w_2")
    norm(target.layer_norm, f"{ours}.sublayer.{sublayer}.norm")
