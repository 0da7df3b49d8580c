"""Weight mapping between attnkit's EncoderModel and HF transformers' BERT classes.

BERT (Devlin et al., 2019) is our :class:`EncoderModel`: post-LN encoder layers with GELU, learned
positions and token types summed and layer-normalised. HF keeps Q, K and V apart (``query``, ``key``,
``value``), which we stack into one ``in_proj``; its layer norms are named after the sub-layer they
follow. Each HF class maps to one of our heads: ``BertModel`` (none), ``BertForMaskedLM`` (mlm),
``BertForSequenceClassification`` (classify, BERT's pooler) and ``BertForQuestionAnswering`` (span).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from attnkit.convert.common import hf_field, load_mapped, require_full_softmax_attention
from attnkit.errors import ConversionError
from attnkit.models.config import EncoderModelConfig
from attnkit.models.encoder_only import EncoderModel

HEAD_OF = {"BertModel": "none", "BertForMaskedLM": "mlm", "BertForSequenceClassification": "classify",
           "BertForQuestionAnswering": "span"}  # fmt: skip
HF_CLASS = {head: name for name, head in HEAD_OF.items()}
_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def config_from_hf_bert(hf_config: Any, head: str = "none") -> EncoderModelConfig:
    """Our config for a ``BertConfig`` (object or dict) and a head; refuses what we cannot represent."""
    get = lambda name, default=None: hf_field(hf_config, name, default)  # noqa: E731
    if get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError(
            f"BERT: position_embedding_type {get('position_embedding_type')!r} is not absolute"
        )
    if get("hidden_act", "gelu") not in _ACTIVATIONS:
        raise ConversionError(f"BERT: hidden_act {get('hidden_act')!r} is not one of {sorted(_ACTIVATIONS)}")
    labels = get("id2label") or {}
    return EncoderModelConfig(
        layers=get("num_hidden_layers"),
        d_model=get("hidden_size"),
        d_ff=get("intermediate_size"),
        h=get("num_attention_heads"),
        dropout=float(get("hidden_dropout_prob", 0.1)),
        attention_dropout=float(get("attention_probs_dropout_prob", 0.1)),
        activation=_ACTIVATIONS[get("hidden_act", "gelu")],
        layer_norm_eps=float(get("layer_norm_eps", 1e-12)),
        max_len=get("max_position_embeddings"),
        type_vocab_size=get("type_vocab_size", 2),
        pad_id=get("pad_token_id") or 0,
        head=head,
        num_labels=len(labels) or get("num_labels", 2) or 2,
    )


def hf_bert_config_kwargs(model: EncoderModel) -> dict[str, Any]:
    """Keyword arguments for ``BertConfig`` describing ``model``; refuses what BERT cannot represent."""
    c = model.config
    require_full_softmax_attention(c, "BERT")
    if c.norm_first or c.positions != "learned" or c.activation_dropout or not c.type_vocab_size:
        raise ConversionError("BERT needs post-LN, learned positions, token types and no FFN dropout")
    if c.head == "classify" and c.pooling != "cls":
        raise ConversionError("BertForSequenceClassification pools with [CLS]; this model mean-pools")
    hf_act = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new"}[c.activation]
    return {"vocab_size": model.vocab_size, "hidden_size": c.d_model, "num_hidden_layers": c.layers,
            "num_attention_heads": c.h, "intermediate_size": c.d_ff, "hidden_act": hf_act,
            "hidden_dropout_prob": c.dropout, "attention_probs_dropout_prob": c.attention_dropout,
            "max_position_embeddings": c.max_len, "type_vocab_size": c.type_vocab_size,
            "layer_norm_eps": c.layer_norm_eps, "pad_token_id": c.pad_id,
            "num_labels": c.num_labels}  # fmt: skip


_BODY, _LAYER = r"(bert\.)?", r"(bert\.)?encoder\.layer\.\d+\."
# the sizes BertConfig gives each weight of a BERT folder (common.check_shapes)
HF_SHAPES = {
    rf"{_BODY}embeddings\.word_embeddings\.weight": ("vocab_size", "hidden_size"),
    rf"{_BODY}embeddings\.position_embeddings\.weight": ("max_position_embeddings", "hidden_size"),
    rf"{_BODY}embeddings\.token_type_embeddings\.weight": ("type_vocab_size", "hidden_size"),
    rf"{_LAYER}attention\.(self\.(query|key|value)|output\.dense)\.weight": ("hidden_size", "hidden_size"),
    rf"{_LAYER}intermediate\.dense\.weight": ("intermediate_size", "hidden_size"),
    rf"{_LAYER}intermediate\.dense\.bias": ("intermediate_size",),
    rf"{_LAYER}output\.dense\.weight": ("hidden_size", "intermediate_size"),
    rf"{_BODY}pooler\.dense\.weight": ("hidden_size", "hidden_size"),
    r"cls\.predictions\.transform\.dense\.weight": ("hidden_size", "hidden_size"),
    r"cls\.predictions\.decoder\.weight": ("vocab_size", "hidden_size"),
    r"cls\.predictions\.bias": ("vocab_size",),
}

_HEAD_KEYS = {  # our head's layers -> HF's
    "mlm": {
        "head.transform": "cls.predictions.transform.dense",
        "head.norm": "cls.predictions.transform.LayerNorm",
    },
    "classify": {"head.pooler": "bert.pooler.dense", "head.classifier": "classifier"},
    "span": {"head.proj": "qa_outputs"},
}


def _key_map(config: EncoderModelConfig) -> dict[str, list[str]]:
    """Our parameter name -> the HF name(s) it holds (several are stacked row-wise)."""
    body = "" if config.head == "none" else "bert."
    keys = {
        "embed.words.lut.weight": [f"{body}embeddings.word_embeddings.weight"],
        "embed.positions.weight": [f"{body}embeddings.position_embeddings.weight"],
        "embed.token_types.weight": [f"{body}embeddings.token_type_embeddings.weight"],
    }
    for part in ("weight", "bias"):
        keys[f"embed.norm.{part}"] = [f"{body}embeddings.LayerNorm.{part}"]
        for i in range(config.layers):
            ours, theirs = f"encoder.layers.{i}", f"{body}encoder.layer.{i}"
            keys[f"{ours}.self_attn.in_proj.{part}"] = [
                f"{theirs}.attention.self.{p}.{part}" for p in ("query", "key", "value")
            ]
            keys[f"{ours}.self_attn.out_proj.{part}"] = [f"{theirs}.attention.output.dense.{part}"]
            keys[f"{ours}.sublayer.0.norm.{part}"] = [f"{theirs}.attention.output.LayerNorm.{part}"]
            keys[f"{ours}.feed_forward.w_1.{part}"] = [f"{theirs}.intermediate.dense.{part}"]
            keys[f"{ours}.feed_forward.w_2.{part}"] = [f"{theirs}.output.dense.{part}"]
            keys[f"{ours}.sublayer.1.norm.{part}"] = [f"{theirs}.output.LayerNorm.{part}"]
        for ours, theirs in _HEAD_KEYS.get(config.head, {}).items():
            keys[f"{ours}.{part}"] = [f"{theirs}.{part}"]
    if config.head == "mlm":
        keys["head.proj.bias"] = ["cls.predictions.bias"]
    return keys


def from_hf_bert(state_dict: Mapping[str, Tensor], hf_config: Any, head: str | None = None) -> EncoderModel:
    """An EncoderModel holding the weights of a BERT state dict; the head follows the config's
    ``architectures`` (``BertForMaskedLM``, ...) unless given."""
    if head is None:
        architecture = (hf_field(hf_config, "architectures", None) or ["BertModel"])[0]
        if architecture not in HEAD_OF:
            raise ConversionError(f"BERT: architecture {architecture!r} is not one of {sorted(HEAD_OF)}")
        head = HEAD_OF[architecture]
    config = config_from_hf_bert(hf_config, head)
    model = EncoderModel(config, hf_field(hf_config, "vocab_size"))
    try:
        ours = {
            mine: torch.cat([state_dict[name] for name in names]) for mine, names in _key_map(config).items()
        }
    except KeyError as missing:
        raise ConversionError(f"BERT state dict has no {missing} (is it a {HF_CLASS[head]}'s?)") from None
    load_mapped(model, ours, "BERT")
    return model


def to_hf_bert(model: EncoderModel) -> dict[str, Tensor]:
    """A state dict that the HF class of the model's head (``HF_CLASS[head]``) loads, built from
    ``BertConfig(**hf_bert_config_kwargs(model))``; a ``BertModel`` also gets a (fresh) pooler."""
    hf_bert_config_kwargs(model)  # refuses models BERT cannot represent
    ours = model.state_dict()
    theirs = {}
    for mine, names in _key_map(model.config).items():
        theirs.update(zip(names, ours[mine].chunk(len(names)), strict=True))
    if model.config.head == "mlm":
        theirs["cls.predictions.decoder.weight"] = ours["head.proj.weight"]
        theirs["cls.predictions.decoder.bias"] = ours["head.proj.bias"]
    return {name: tensor.detach().contiguous().clone() for name, tensor in theirs.items()}
