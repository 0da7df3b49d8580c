"""Model configuration as a dataclass, with named presets.

``paper-base`` and ``paper-big`` are Table 3 of Vaswani et al. (2017); ``small`` and ``tiny`` are for
CPU work and tests. Unknown fields are errors that name the field (a misspelt key must never be
silently dropped).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from attnkit.errors import ConfigError, require_at_least, require_fraction, require_one_of


@dataclass
class TransformerConfig:
    """The encoder-decoder Transformer's hyper-parameters; defaults are the paper's base model."""

    encoder_layers: int = 6  # N (encoder)
    decoder_layers: int = 6  # N (decoder)
    d_model: int = 512
    d_ff: int = 2048
    h: int = 8  # heads; d_k = d_v = d_model / h
    dropout: float = 0.1  # P_drop: residual sub-layer outputs and embedding sums (§5.4)
    attention_dropout: float = 0.0  # on attention weights (not in the paper; tensor2tensor has it)
    activation_dropout: float = 0.0  # inside the FFN (not in the paper; torch.nn.Transformer has it)
    activation: str = "relu"  # FFN non-linearity: "relu" (paper) or "gelu"
    norm_first: bool = False  # False = post-LN as in the paper; True = pre-LN
    layer_norm_eps: float = 1e-5
    positions: str = "sinusoidal"  # "sinusoidal" (paper) or "learned"
    sinusoid_layout: str = "interleaved"  # "interleaved" (paper) or "concatenated" (fairseq, Marian)
    max_len: int = 1024  # longest sequence the model handles: learned positions stop here, decoding cuts here
    share_embeddings: bool = True  # one embedding for source and target (needs a shared vocabulary)
    tie_output: bool = True  # target embedding = pre-softmax projection (§3.4)
    output_bias: bool = False  # a bias on the output projection (Marian's final_logits_bias)
    pad_id: int = 0  # set from the tokenizer's <pad> when a model is trained or loaded

    def __post_init__(self) -> None:
        for name in ("encoder_layers", "decoder_layers", "d_model", "d_ff", "h", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{name} must be a positive integer; got {value!r}")
        if self.d_model % self.h != 0:
            raise ConfigError(f"model.d_model ({self.d_model}) must be divisible by model.h ({self.h})")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            require_fraction(f"model.{name}", getattr(self, name))
        require_at_least("model.layer_norm_eps", self.layer_norm_eps, 0, strictly=True)
        require_at_least("model.pad_id", self.pad_id, 0)
        require_one_of("model.activation", self.activation, ("relu", "gelu"))
        require_one_of("model.positions", self.positions, ("sinusoidal", "learned"))
        require_one_of("model.sinusoid_layout", self.sinusoid_layout, ("interleaved", "concatenated"))

    @property
    def d_k(self) -> int:
        return self.d_model // self.h

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> TransformerConfig:
        """Build from a mapping; an unknown key is an error naming the key and where it came from."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown model field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**values)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> TransformerConfig:
        """A named preset, with fields overridden: ``from_preset("paper-base", dropout=0.3)``."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides}, source=f"preset {name!r}")


PRESETS: dict[str, dict[str, Any]] = {
    # Table 3, "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1 (65M parameters).
    "paper-base": {},
    # Table 3, "big": N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (213M parameters).
    "paper-big": {"d_model": 1024, "d_ff": 4096, "h": 16, "dropout": 0.3},
    # A model that trains in minutes on a laptop CPU.
    "small": {"encoder_layers": 3, "decoder_layers": 3, "d_model": 256, "d_ff": 1024, "h": 4},
    # For tests and toy tasks.
    "tiny": {"encoder_layers": 2, "decoder_layers": 2, "d_model": 32, "d_ff": 64, "h": 4, "dropout": 0.0},
}
