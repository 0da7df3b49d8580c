"""The Transformers' configurations as dataclasses, one per architecture, with named presets, on one
base (:class:`BaseTransformerConfig`: the fields they share, the paper's defaults, the checks).

- :class:`TransformerConfig` (``arch: encoder-decoder``), the paper's model: ``paper-base`` and
  ``paper-big`` are Table 3 of Vaswani et al. (2017); ``small`` and ``tiny`` are for CPU work and tests.
- :class:`DecoderModelConfig` (``arch: decoder``), GPT-style: ``gpt2`` is GPT-2 small's shape (Radford et
  al., 2019); ``shakespeare-char`` nanoGPT's character-level recipe; ``tiny-decoder`` for tests.
- :class:`EncoderModelConfig` (``arch: encoder``), BERT-style: ``bert-base``, ``minilm-l6``,
  ``tiny-encoder``.

The ``arch`` field names the architecture in a run's YAML and in a checkpoint's ``config.json``.
Unknown fields are errors that name the field (a misspelt key must never be silently dropped).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from attnkit.attention.normalisers import NORMALISERS
from attnkit.errors import ConfigError, require_at_least, require_fraction, require_one_of

ACTIVATIONS = ("relu", "gelu", "gelu_tanh")


def check_transformer_fields(config: Any, layer_fields: tuple[str, ...]) -> None:
    """The checks every Transformer config shares: sizes, rates and choices, each naming its field."""
    require_one_of("model.arch", config.arch, (config.ARCH,))
    for name in (*layer_fields, "d_model", "d_ff", "h", "max_len"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"model.{name} must be a positive integer; got {value!r}")
    if config.d_model % config.h != 0:
        raise ConfigError(f"model.d_model ({config.d_model}) must be divisible by model.h ({config.h})")
    for name in ("dropout", "attention_dropout", "activation_dropout"):
        require_fraction(f"model.{name}", getattr(config, name))
    require_at_least("model.layer_norm_eps", config.layer_norm_eps, 0, strictly=True)
    require_at_least("model.pad_id", config.pad_id, 0)
    require_one_of("model.activation", config.activation, ACTIVATIONS)
    require_one_of("model.positions", config.positions, ("sinusoidal", "learned"))
    require_one_of("model.sinusoid_layout", config.sinusoid_layout, ("interleaved", "concatenated"))
    require_one_of("model.attention_normaliser", config.attention_normaliser, tuple(NORMALISERS))
    require_at_least("model.attention_window", config.attention_window, 0)


class _Presets:
    """``to_dict``, ``from_dict`` and ``from_preset`` for a config dataclass with a ``PRESETS`` table."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}

    @property
    def d_k(self) -> int:
        return self.d_model // self.h

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config"):
        """Build from a mapping; an unknown key is an error naming the key and where it came from."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown model field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**values)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any):
        """A named preset, with fields overridden: ``from_preset("paper-base", dropout=0.3)``."""
        if name not in cls.PRESETS:
            raise ConfigError(f"unknown {cls.ARCH} preset {name!r}; choose one of {sorted(cls.PRESETS)}")
        return cls.from_dict({**cls.PRESETS[name], **overrides}, source=f"preset {name!r}")


@dataclass
class BaseTransformerConfig(_Presets):
    """What every Transformer's config holds: the encoder-decoder's, GPT's decoder's and BERT's
    encoder's. The defaults here are the paper's; each architecture declares again the fields whose
    defaults are its own (a field declared again keeps its place and takes the new default)."""

    LAYER_FIELDS: ClassVar[tuple[str, ...]] = ("layers",)  # the fields that count layers

    arch: str = ""  # the architecture's name: its class's ARCH
    d_model: int = 512
    d_ff: int = 2048
    h: int = 8  # heads; d_k = d_v = d_model / h
    dropout: float = 0.1  # P_drop: residual sub-layer outputs and embedding sums (§5.4)
    attention_dropout: float = 0.0  # on attention weights (not in the paper; tensor2tensor has it)
    activation_dropout: float = 0.0  # inside the FFN (not in the paper; torch.nn.Transformer has it)
    activation: str = "relu"  # FFN non-linearity: "relu" (paper), "gelu" or "gelu_tanh"
    norm_first: bool = False  # False = post-LN as in the paper; True = pre-LN
    layer_norm_eps: float = 1e-5
    positions: str = "sinusoidal"  # "sinusoidal" (paper) or "learned"
    sinusoid_layout: str = "interleaved"  # "interleaved" (paper) or "concatenated" (fairseq, Marian)
    max_len: int = 1024  # longest sequence the model handles: learned positions stop here, decoding cuts here
    pad_id: int = 0  # set from the tokenizer's <pad> when a model is trained or loaded
    attention_normaliser: str = "softmax"  # scores -> weights: "softmax" (paper), "relu", "gelu", "sigmoid"
    attention_window: int = 0  # > 0: self-attention sees only keys within this many positions (local)

    def __post_init__(self) -> None:
        check_transformer_fields(self, self.LAYER_FIELDS)


@dataclass
class TransformerConfig(BaseTransformerConfig):
    """The encoder-decoder Transformer's hyper-parameters; defaults are the paper's base model."""

    ARCH: ClassVar[str] = "encoder-decoder"
    LAYER_FIELDS: ClassVar[tuple[str, ...]] = ("encoder_layers", "decoder_layers")
    arch: str = "encoder-decoder"
    encoder_layers: int = 6  # N (encoder)
    decoder_layers: int = 6  # N (decoder)
    share_embeddings: bool = True  # one embedding for source and target (needs a shared vocabulary)
    tie_output: bool = True  # target embedding = pre-softmax projection (§3.4)
    output_bias: bool = False  # a bias on the output projection (Marian's final_logits_bias)
    copy: bool = False  # pointer-generator output (See et al., 2017): also copy source tokens; one vocabulary
    # BERT's embedding, for an encoder warm-started from one (train.init_from): no ×√d_model, and
    # LayerNorm(token + position) before the dropout, on both sides
    scale_embeddings: bool = True
    embedding_norm: bool = False

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        # Table 3, "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1 (65M parameters).
        "paper-base": {},
        # Table 3, "big": N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (213M parameters).
        "paper-big": {"d_model": 1024, "d_ff": 4096, "h": 16, "dropout": 0.3},
        # A model that trains in minutes on a laptop CPU.
        "small": {"encoder_layers": 3, "decoder_layers": 3, "d_model": 256, "d_ff": 1024, "h": 4},
        # For tests and toy tasks.
        "tiny": {"encoder_layers": 2, "decoder_layers": 2, "d_model": 32, "d_ff": 64, "h": 4, "dropout": 0.0},
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.copy and not self.share_embeddings:
            raise ConfigError(
                "model.copy points at source tokens as output tokens: it needs one vocabulary for both "
                "(model.share_embeddings=true)"
            )


@dataclass
class DecoderModelConfig(BaseTransformerConfig):
    """A GPT-style decoder-only Transformer; defaults are GPT-2 small's (Radford et al., 2019):
    pre-LN, learned positions, GELU, a final LayerNorm, the output tied to the token embedding."""

    ARCH: ClassVar[str] = "decoder"
    arch: str = "decoder"
    d_model: int = 768
    d_ff: int = 3072
    h: int = 12
    attention_dropout: float = 0.1  # GPT-2's attn_pdrop (dropout: its embd/resid_pdrop)
    activation: str = "gelu_tanh"  # GPT-2's "gelu_new"
    norm_first: bool = True  # pre-LN (GPT-2); False = post-LN (the first GPT)
    positions: str = "learned"  # or "sinusoidal"
    layers: int = 12  # N
    scale_embeddings: bool = False  # × √d_model as in the paper; GPT does not scale
    tie_output: bool = True  # output projection = token embedding
    output_bias: bool = False

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        # GPT-2 small: 12 layers, 768 wide, 12 heads, 1024 positions (124M parameters with its vocabulary).
        "gpt2": {},
        # nanoGPT's train_shakespeare_char: 6 layers, 6 heads, 384 wide, block 256, dropout 0.2.
        "shakespeare-char": dict(
            layers=6, d_model=384, d_ff=1536, h=6, max_len=256, dropout=0.2, attention_dropout=0.2
        ),
        # For tests.
        "tiny-decoder": dict(
            layers=2, d_model=32, d_ff=64, h=4, max_len=64, dropout=0.0, attention_dropout=0.0
        ),
    }


HEADS = ("none", "mlm", "classify", "span")


@dataclass
class EncoderModelConfig(BaseTransformerConfig):
    """A BERT-style encoder-only Transformer; defaults are BERT-base's (Devlin et al., 2019): post-LN,
    learned positions and token types, a LayerNorm on the embedding sum, GELU, no embedding scaling.

    ``head`` is what sits on the encoder: ``none`` (the hidden states, e.g. for sentence embeddings),
    ``mlm`` (masked-token logits, tied to the embedding), ``classify`` (``num_labels`` logits from the
    ``pooling`` of the sequence) or ``span`` (start and end logits per token, for extractive QA)."""

    ARCH: ClassVar[str] = "encoder"
    arch: str = "encoder"
    d_model: int = 768
    d_ff: int = 3072
    h: int = 12
    attention_dropout: float = 0.1  # BERT's attention_probs_dropout (dropout: its hidden_dropout)
    activation: str = "gelu"  # post-LN (norm_first: False), as BERT and the paper
    layer_norm_eps: float = 1e-12
    positions: str = "learned"
    max_len: int = 512
    layers: int = 12  # N
    type_vocab_size: int = 2  # segments (sentence A / B); 0 = none
    head: str = "none"
    pooling: str = "cls"  # classify: "cls" (BERT's pooler, tanh(W h_[CLS])) or "mean" over real tokens
    num_labels: int = 2  # classify: how many classes

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        # BERT-base: 12 layers, 768 wide, 12 heads, 512 positions (110M parameters with its vocabulary).
        "bert-base": {},
        # all-MiniLM-L6-v2's shape: 6 layers, 384 wide, 12 heads.
        "minilm-l6": {"layers": 6, "d_model": 384, "d_ff": 1536},
        # For tests.
        "tiny-encoder": dict(
            layers=2, d_model=32, d_ff=64, h=4, max_len=64, dropout=0.0, attention_dropout=0.0
        ),
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        require_one_of("model.head", self.head, HEADS)
        require_one_of("model.pooling", self.pooling, ("cls", "mean"))
        require_at_least("model.type_vocab_size", self.type_vocab_size, 0)
        require_at_least("model.num_labels", self.num_labels, 1)

    @property
    def classifies(self) -> bool:
        """Whether its head gives ``num_labels`` logits (whose names a classifier's run keeps)."""
        return self.head == "classify"
