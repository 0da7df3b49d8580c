"""Weight mapping between attnkit's EncoderDecoder and HF transformers' MarianMTModel.

Marian (and so OPUS-MT) is the paper's architecture: post-LN, ReLU or GELU feed-forward, embeddings
scaled by √d_model, sinusoidal positions with sines and cosines concatenated rather than interleaved,
one embedding shared by source, target and output, plus a bias on the logits. The conversion works on
plain state dicts, so attnkit never imports transformers; only the parity tests do.

Our attention keeps Q, K and V stacked in one ``in_proj`` (3·d_model rows); Marian keeps ``q_proj``,
``k_proj`` and ``v_proj`` apart. Each direction concatenates or splits those rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from attnkit.convert.common import (
    hf_field,
    load_mapped,
    require_full_softmax_attention,
    require_paper_embeddings,
    require_plain_output,
)
from attnkit.errors import ConversionError
from attnkit.models.config import TransformerConfig
from attnkit.models.seq2seq import EncoderDecoder
from attnkit.nn.embedding import sinusoid_table

# Marian's names for the LayerNorm after each sub-layer (in our order), and for the decoder's attentions.
_ENCODER_NORMS = ("self_attn_layer_norm", "final_layer_norm")
_DECODER_NORMS = ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")
_DECODER_ATTENTION = (("self_attn", "self_attn"), ("src_attn", "encoder_attn"))


def config_from_hf_marian(hf_config: Any) -> TransformerConfig:
    """Our config for a ``MarianConfig`` (object or dict); refuses what our model cannot represent."""
    get = lambda name: hf_field(hf_config, name)  # noqa: E731
    if get("encoder_attention_heads") != get("decoder_attention_heads"):
        raise ConversionError("Marian: encoder and decoder must have the same number of attention heads")
    if get("encoder_ffn_dim") != get("decoder_ffn_dim"):
        raise ConversionError("Marian: encoder_ffn_dim and decoder_ffn_dim must be equal")
    if get("activation_function") not in ("relu", "gelu"):
        raise ConversionError(
            f"Marian: activation_function {get('activation_function')!r} is not relu or gelu"
        )
    if not get("scale_embedding"):
        raise ConversionError(
            "Marian: scale_embedding=False is not the paper's model (embeddings × √d_model)"
        )
    return TransformerConfig(
        encoder_layers=get("encoder_layers"),
        decoder_layers=get("decoder_layers"),
        d_model=get("d_model"),
        d_ff=get("encoder_ffn_dim"),
        h=get("encoder_attention_heads"),
        dropout=float(get("dropout")),
        attention_dropout=float(get("attention_dropout")),
        activation_dropout=float(get("activation_dropout")),
        activation=get("activation_function"),
        sinusoid_layout="concatenated",
        max_len=get("max_position_embeddings"),
        share_embeddings=bool(get("share_encoder_decoder_embeddings")),
        tie_output=True,
        output_bias=True,
        pad_id=get("pad_token_id"),
    )


def hf_marian_config_kwargs(model: EncoderDecoder) -> dict[str, Any]:
    """Keyword arguments for ``MarianConfig`` describing ``model``."""
    c = model.config
    require_full_softmax_attention(c, "Marian")
    require_plain_output(c, "Marian")
    require_paper_embeddings(c, "Marian")
    if c.norm_first or c.positions != "sinusoidal" or c.sinusoid_layout != "concatenated":
        raise ConversionError("Marian needs post-LN (norm_first=False) and concatenated sinusoidal positions")
    if not c.tie_output:
        raise ConversionError("Marian ties the output projection to the target embedding (tie_output=True)")
    return {
        "vocab_size": model.src_vocab,
        "decoder_vocab_size": model.tgt_vocab,
        "share_encoder_decoder_embeddings": c.share_embeddings,
        "d_model": c.d_model,
        "encoder_layers": c.encoder_layers,
        "decoder_layers": c.decoder_layers,
        "encoder_attention_heads": c.h,
        "decoder_attention_heads": c.h,
        "encoder_ffn_dim": c.d_ff,
        "decoder_ffn_dim": c.d_ff,
        "activation_function": c.activation,
        "dropout": c.dropout,
        "attention_dropout": c.attention_dropout,
        "activation_dropout": c.activation_dropout,
        "max_position_embeddings": c.max_len,
        "scale_embedding": True,
        "pad_token_id": c.pad_id,
        "decoder_start_token_id": c.pad_id,
    }


def _key_map(model: EncoderDecoder) -> dict[str, list[str]]:
    """Our layer parameter name -> the Marian name(s) it holds; several names are stacked row-wise."""
    keys: dict[str, list[str]] = {}

    def attention(ours: str, theirs: str) -> None:
        for part in ("weight", "bias"):
            keys[f"{ours}.in_proj.{part}"] = [f"{theirs}.{p}_proj.{part}" for p in "qkv"]
            keys[f"{ours}.out_proj.{part}"] = [f"{theirs}.out_proj.{part}"]

    def feed_forward_and_norms(ours: str, theirs: str, norms: tuple[str, ...]) -> None:
        for part in ("weight", "bias"):
            keys[f"{ours}.feed_forward.w_1.{part}"] = [f"{theirs}.fc1.{part}"]
            keys[f"{ours}.feed_forward.w_2.{part}"] = [f"{theirs}.fc2.{part}"]
            for j, norm in enumerate(norms):
                keys[f"{ours}.sublayer.{j}.norm.{part}"] = [f"{theirs}.{norm}.{part}"]

    for i in range(model.config.encoder_layers):
        attention(f"encoder.layers.{i}.self_attn", f"model.encoder.layers.{i}.self_attn")
        feed_forward_and_norms(f"encoder.layers.{i}", f"model.encoder.layers.{i}", _ENCODER_NORMS)
    for i in range(model.config.decoder_layers):
        for ours, theirs in _DECODER_ATTENTION:
            attention(f"decoder.layers.{i}.{ours}", f"model.decoder.layers.{i}.{theirs}")
        feed_forward_and_norms(f"decoder.layers.{i}", f"model.decoder.layers.{i}", _DECODER_NORMS)
    return keys


def _embedding_keys(share: bool) -> tuple[str, str]:
    if share:
        return "model.shared.weight", "model.shared.weight"
    return "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"


_ATTENTION = r"model\.(encoder\.layers\.\d+\.self_attn|decoder\.layers\.\d+\.(self_attn|encoder_attn))"
# the sizes MarianConfig gives each weight of a Marian folder (common.check_shapes)
HF_SHAPES = {
    r"model\.(shared|encoder\.embed_tokens)\.weight": ("vocab_size", "d_model"),
    r"(model\.decoder\.embed_tokens|lm_head)\.weight": ("decoder_vocab_size|vocab_size", "d_model"),
    r"final_logits_bias": ("1", "decoder_vocab_size|vocab_size"),
    r"model\.(encoder|decoder)\.embed_positions\.weight": ("max_position_embeddings", "d_model"),
    rf"{_ATTENTION}\.(q|k|v|out)_proj\.weight": ("d_model", "d_model"),
    r"model\.encoder\.layers\.\d+\.fc1\.weight": ("encoder_ffn_dim", "d_model"),
    r"model\.encoder\.layers\.\d+\.fc1\.bias": ("encoder_ffn_dim",),
    r"model\.encoder\.layers\.\d+\.fc2\.weight": ("d_model", "encoder_ffn_dim"),
    r"model\.decoder\.layers\.\d+\.fc1\.weight": ("decoder_ffn_dim", "d_model"),
    r"model\.decoder\.layers\.\d+\.fc1\.bias": ("decoder_ffn_dim",),
    r"model\.decoder\.layers\.\d+\.fc2\.weight": ("d_model", "decoder_ffn_dim"),
}


def from_hf_marian(state_dict: Mapping[str, Tensor], hf_config: Any) -> EncoderDecoder:
    """An EncoderDecoder holding the weights of a MarianMTModel ``state_dict`` with ``hf_config``."""
    config = config_from_hf_marian(hf_config)
    src_vocab, tgt_vocab = hf_field(hf_config, "vocab_size"), hf_field(hf_config, "decoder_vocab_size")
    model = EncoderDecoder(config, src_vocab, tgt_vocab or src_vocab)
    src_key, tgt_key = _embedding_keys(config.share_embeddings)
    try:
        ours = {
            "src_embed.lut.weight": state_dict[src_key],
            "generator.proj.bias": state_dict["final_logits_bias"][0],
        }
        if not config.share_embeddings:
            ours["tgt_embed.lut.weight"] = state_dict[tgt_key]
        for mine, theirs in _key_map(model).items():
            ours[mine] = torch.cat([state_dict[name] for name in theirs])
    except KeyError as missing:
        raise ConversionError(f"Marian state dict has no {missing} (is it a MarianMTModel's?)") from None
    load_mapped(model, ours, "Marian")
    return model


def to_hf_marian(model: EncoderDecoder) -> dict[str, Tensor]:
    """A state dict that ``MarianMTModel(MarianConfig(**hf_marian_config_kwargs(model)))`` loads strictly."""
    hf_marian_config_kwargs(model)  # refuses models Marian cannot represent
    ours = model.state_dict()
    c = model.config
    src_key, tgt_key = _embedding_keys(c.share_embeddings)
    theirs = {
        src_key: ours["src_embed.lut.weight"],
        tgt_key: ours["tgt_embed.lut.weight"],
        "model.encoder.embed_tokens.weight": ours["src_embed.lut.weight"],
        "model.decoder.embed_tokens.weight": ours["tgt_embed.lut.weight"],
        "lm_head.weight": ours["generator.proj.weight"],
        "final_logits_bias": ours.get("generator.proj.bias", torch.zeros(model.tgt_vocab)).unsqueeze(0),
    }
    positions = sinusoid_table(c.max_len, c.d_model, "concatenated")
    theirs["model.encoder.embed_positions.weight"] = positions
    theirs["model.decoder.embed_positions.weight"] = positions.clone()
    for mine, names in _key_map(model).items():
        theirs.update(zip(names, ours[mine].chunk(len(names)), strict=True))
    return {name: tensor.detach().clone() for name, tensor in theirs.items()}


def with_concatenated_sinusoids(model: EncoderDecoder) -> EncoderDecoder:
    """The same function as ``model`` with Marian's concatenated sinusoids instead of the paper's
    interleaved ones (``model`` itself when it has them already).

    The concatenated table is the interleaved one with its dimensions reordered (sines of dimensions
    0, 2, 4, ... first, then the cosines of 1, 3, 5, ...). Reordering every vector of the residual stream
    the same way changes nothing else: each layer that reads the stream gets its input columns
    reordered, each that writes to it its output rows, LayerNorm (which normalises over the set of
    dimensions, in any order) its gains and biases, the embeddings (and the tied output) their columns.
    """
    c = model.config
    if c.positions != "sinusoidal" or c.sinusoid_layout == "concatenated":
        return model
    if c.d_model % 2:
        raise ConversionError(f"an odd d_model ({c.d_model}) has no concatenated sinusoid layout")
    order = torch.cat(
        [torch.arange(0, c.d_model, 2), torch.arange(1, c.d_model, 2)]
    )  # new dim k = old order[k]
    reads = ("lut.weight", "in_proj.weight", "w_1.weight", "generator.proj.weight")  # (·, d_model) inputs
    writes = ("out_proj.weight", "out_proj.bias", "w_2.weight", "w_2.bias", "norm.weight", "norm.bias")
    unchanged = ("in_proj.bias", "w_1.bias", "generator.proj.bias")
    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith(reads):
            state[name] = tensor[:, order]
        elif name.endswith(writes):
            state[name] = tensor[order]
        elif name.endswith(unchanged):
            state[name] = tensor
        else:
            raise ConversionError(f"cannot reorder {name!r} to the concatenated sinusoid layout")
    converted = EncoderDecoder(replace(c, sinusoid_layout="concatenated"), model.src_vocab, model.tgt_vocab)
    load_mapped(converted.to(model.src_embed.lut.weight.dtype), state, "attnkit")  # in the model's precision
    return converted.train(model.training)
