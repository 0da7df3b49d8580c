"""Weight mapping between attnkit's DecoderModel and HF transformers' GPT2LMHeadModel.

GPT-2 (Radford et al., 2019) is our :class:`DecoderModel` with pre-LN, learned positions, GELU in its
tanh approximation (HF's ``gelu_new``), unscaled embeddings, a final LayerNorm and the output tied to the
token embedding. HF keeps GPT-2's original ``Conv1D`` layers, whose weights are stored ``(in, out)``,
the transpose of ``nn.Linear``'s; ``c_attn`` holds Q, K and V side by side in its columns, which
transposed are exactly our stacked ``in_proj`` rows ``[W^Q; W^K; W^V]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from attnkit.convert.common import hf_field, load_mapped, require_full_softmax_attention
from attnkit.errors import ConversionError
from attnkit.models.config import DecoderModelConfig
from attnkit.models.decoder_only import DecoderModel

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def config_from_hf_gpt2(hf_config: Any) -> DecoderModelConfig:
    """Our config for a ``GPT2Config`` (object or dict); refuses what our model cannot represent."""
    get = lambda name, default=None: hf_field(hf_config, name, default)  # noqa: E731
    if not get("scale_attn_weights", True) or get("scale_attn_by_inverse_layer_idx", False):
        raise ConversionError("GPT-2: only attention scaled by 1/√d_k (scale_attn_weights) is supported")
    if get("add_cross_attention", False):
        raise ConversionError("GPT-2 with cross-attention is an encoder-decoder, not a decoder-only model")
    if get("activation_function", "gelu_new") not in _ACTIVATIONS:
        raise ConversionError(
            f"GPT-2: activation_function {get('activation_function')!r} is not one of {sorted(_ACTIVATIONS)}"
        )
    pad = get("pad_token_id")
    return DecoderModelConfig(
        layers=get("n_layer"),
        d_model=get("n_embd"),
        d_ff=get("n_inner") or 4 * get("n_embd"),
        h=get("n_head"),
        dropout=float(get("resid_pdrop", 0.1)),  # GPT-2 uses the same rate for embd_pdrop
        attention_dropout=float(get("attn_pdrop", 0.1)),
        activation=_ACTIVATIONS[get("activation_function", "gelu_new")],
        norm_first=True,
        layer_norm_eps=float(get("layer_norm_epsilon", 1e-5)),
        positions="learned",
        max_len=get("n_positions"),
        scale_embeddings=False,
        tie_output=bool(get("tie_word_embeddings", True)),
        pad_id=pad if pad is not None else (get("eos_token_id") or 0),
    )


def hf_gpt2_config_kwargs(model: DecoderModel) -> dict[str, Any]:
    """Keyword arguments for ``GPT2Config`` describing ``model``; refuses what GPT-2 cannot represent."""
    c = model.config
    require_full_softmax_attention(c, "GPT-2")
    if not c.norm_first or c.positions != "learned" or c.scale_embeddings or c.output_bias:
        raise ConversionError(
            "GPT-2 needs pre-LN (norm_first), learned positions, unscaled embeddings and no output bias"
        )
    if c.activation_dropout:
        raise ConversionError("GPT-2 has no dropout inside the FFN (activation_dropout must be 0)")
    return {
        "vocab_size": model.vocab_size,
        "n_positions": c.max_len,
        "n_embd": c.d_model,
        "n_layer": c.layers,
        "n_head": c.h,
        "n_inner": c.d_ff,
        "activation_function": _HF_ACTIVATION[c.activation],
        "resid_pdrop": c.dropout,
        "embd_pdrop": c.dropout,
        "attn_pdrop": c.attention_dropout,
        "layer_norm_epsilon": c.layer_norm_eps,
        "tie_word_embeddings": c.tie_output,
        "pad_token_id": c.pad_id,
    }


def _key_map(layers: int) -> dict[str, str]:
    """Our parameter name -> GPT-2's (without the ``transformer.`` prefix)."""
    keys = {"embed.lut.weight": "wte.weight", "positions.weight": "wpe.weight"}
    for part in ("weight", "bias"):
        keys[f"decoder.norm.{part}"] = f"ln_f.{part}"
        for i in range(layers):
            ours, theirs = f"decoder.layers.{i}", f"h.{i}"
            keys[f"{ours}.sublayer.0.norm.{part}"] = f"{theirs}.ln_1.{part}"
            keys[f"{ours}.self_attn.in_proj.{part}"] = f"{theirs}.attn.c_attn.{part}"
            keys[f"{ours}.self_attn.out_proj.{part}"] = f"{theirs}.attn.c_proj.{part}"
            keys[f"{ours}.sublayer.1.norm.{part}"] = f"{theirs}.ln_2.{part}"
            keys[f"{ours}.feed_forward.w_1.{part}"] = f"{theirs}.mlp.c_fc.{part}"
            keys[f"{ours}.feed_forward.w_2.{part}"] = f"{theirs}.mlp.c_proj.{part}"
    return keys


_LAYER = r"(transformer\.)?h\.\d+\."
# the sizes GPT2Config gives each weight of a GPT-2 folder (common.check_shapes); GPT-2's Conv1D keeps
# its weights as (in, out), the transpose of nn.Linear's
HF_SHAPES = {
    r"(transformer\.)?wte\.weight": ("vocab_size", "n_embd"),
    r"(transformer\.)?wpe\.weight": ("n_positions", "n_embd"),
    rf"{_LAYER}attn\.c_attn\.weight": ("n_embd", "3*n_embd"),
    rf"{_LAYER}attn\.c_attn\.bias": ("3*n_embd",),
    rf"{_LAYER}attn\.c_proj\.weight": ("n_embd", "n_embd"),
    rf"{_LAYER}mlp\.c_fc\.weight": ("n_embd", "n_inner|4*n_embd"),
    rf"{_LAYER}mlp\.c_fc\.bias": ("n_inner|4*n_embd",),
    rf"{_LAYER}mlp\.c_proj\.weight": ("n_inner|4*n_embd", "n_embd"),
    r"lm_head\.weight": ("vocab_size", "n_embd"),
}


def from_hf_gpt2(state_dict: Mapping[str, Tensor], hf_config: Any) -> DecoderModel:
    """A DecoderModel holding the weights of a ``GPT2LMHeadModel`` (or ``GPT2Model``) state dict."""
    config = config_from_hf_gpt2(hf_config)
    theirs = {name.removeprefix("transformer."): tensor for name, tensor in state_dict.items()}
    model = DecoderModel(config, hf_field(hf_config, "vocab_size"))
    ours: dict[str, Tensor] = {}
    try:
        for mine, name in _key_map(config.layers).items():
            ours[mine] = theirs[name].T if name.endswith(_TRANSPOSED) else theirs[name]
        if not config.tie_output:
            ours["generator.proj.weight"] = theirs["lm_head.weight"]
    except KeyError as missing:
        raise ConversionError(f"GPT-2 state dict has no {missing} (is it a GPT2LMHeadModel's?)") from None
    load_mapped(model, ours, "GPT-2")
    return model


def to_hf_gpt2(model: DecoderModel) -> dict[str, Tensor]:
    """A state dict that ``GPT2LMHeadModel(GPT2Config(**hf_gpt2_config_kwargs(model)))`` loads strictly."""
    hf_gpt2_config_kwargs(model)  # refuses models GPT-2 cannot represent
    ours = model.state_dict()
    theirs = {}
    for mine, name in _key_map(model.config.layers).items():
        tensor = ours[mine].T if name.endswith(_TRANSPOSED) else ours[mine]
        theirs[f"transformer.{name}"] = tensor.detach().contiguous().clone()
    theirs["lm_head.weight"] = ours["generator.proj.weight"].detach().clone()
    return theirs
