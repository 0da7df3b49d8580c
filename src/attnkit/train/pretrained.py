"""Starting a run from pretrained weights (``train.init_from``): fine-tuning.

The source is an attnkit checkpoint (or run directory: its best checkpoint) or a local HF model folder
(``config.json``, ``model.safetensors``, ``tokenizer.json``; e.g. all-MiniLM-L6-v2). The new run takes
from it the model's shape (layers, widths, positions, ...) and its tokenizer, and keeps its own head
and dropout settings: a masked-LM checkpoint becomes a classifier by dropping the masked-LM head and
starting a new classification head (BERT §4: "the same pre-trained model parameters are used to
initialise models for different down-stream tasks"). Every weight of the body must come from the
source; only the head may be new.

An encoder-decoder may also start from a BERT-style encoder (``model.arch: encoder`` in the source):
its encoder and source embedding are the pretrained ones, and the decoder, new, gets the same widths
and the shared vocabulary (Rothe et al., 2020, "BERT2Rnd"). The run sets the decoder's depth, dropout,
``copy`` and the like.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import ConfigError
from attnkit.models import EncoderModelConfig, TransformerConfig, load_weights

# What a fine-tuning run sets itself; every other model field comes from the pretrained model.
RUN_FIELDS = ("head", "pooling", "num_labels", "dropout", "attention_dropout", "activation_dropout")
# An encoder-only model's names -> an encoder-decoder's; what the latter has beyond them starts new.
ENCODER_NAMES = {"embed.words.": "src_embed.", "embed.positions.": "src_pos.",
                 "embed.norm.": "src_norm.norm.", "encoder.": "encoder."}  # fmt: skip
NEW_UNDER_ENCODER = ("decoder.", "tgt_pos.", "tgt_norm.", "generator.", "pointer.")
# What an encoder-decoder takes from a pretrained encoder it starts from.
ENCODER_SHAPE = ("d_model", "d_ff", "h", "activation", "layer_norm_eps", "positions", "max_len", "norm_first",
                 "attention_normaliser", "attention_window")  # fmt: skip


@dataclass
class Pretrained:
    """A pretrained model's config, weights (attnkit's names) and tokenizer, and where they came from."""

    source: str
    config: object
    weights: dict[str, Tensor]
    tokenizer: Tokenizer

    def shape_for(self, run_model: object) -> object:
        """The run's model config: the pretrained shape with the run's head and dropouts. A shape field
        the run sets to something other than its default and the pretrained value is an error, so
        that ``model.layers: 2`` is never silently ignored."""
        if self._warm_starts_encoder(run_model):
            return self._encoder_decoder_shape(run_model)
        if self.config.arch != run_model.arch:
            raise ConfigError(
                f"train.init_from={self.source!r} holds a model.arch={self.config.arch!r} model; this "
                f"run's model.arch is {run_model.arch!r}"
            )
        kept = [f.name for f in dataclasses.fields(run_model) if f.name not in (*RUN_FIELDS, "pad_id")]
        shape = {name: getattr(self.config, name) for name in kept}  # pad_id comes from the tokenizer
        self._refuse_overrides(run_model, shape, f"train.init_from={self.source!r} has",
                               ": a fine-tuned model keeps the pretrained shape")  # fmt: skip
        return dataclasses.replace(
            self.config, **{name: getattr(run_model, name) for name in RUN_FIELDS if hasattr(run_model, name)}
        )

    def _warm_starts_encoder(self, run_model: object) -> bool:
        return isinstance(self.config, EncoderModelConfig) and isinstance(run_model, TransformerConfig)

    def _encoder_decoder_shape(self, run_model: object) -> object:
        """The encoder's shape and BERT's embedding (unscaled, layer-normalised), the run's decoder."""
        taken = {name: getattr(self.config, name) for name in ENCODER_SHAPE}
        taken.update(encoder_layers=self.config.layers, scale_embeddings=False, embedding_norm=True,
                     share_embeddings=True)  # fmt: skip
        self._refuse_overrides(run_model, taken, f"the encoder in train.init_from={self.source!r} needs")
        return dataclasses.replace(run_model, **taken)

    @staticmethod
    def _refuse_overrides(
        run_model: object, pretrained: dict[str, object], holder: str, why: str = ""
    ) -> None:
        """A field the run sets to something other than its default and the ``pretrained`` value is an
        error (so that ``model.layers: 2`` is never silently ignored); ``holder`` and ``why`` word it."""
        defaults = type(run_model)()
        for name, theirs in pretrained.items():
            mine = getattr(run_model, name)
            if mine not in (theirs, getattr(defaults, name)):
                raise ConfigError(
                    f"model.{name}={mine!r}, but {holder} {theirs!r}{why} (leave model.{name} out)"
                )

    def load_into(self, model: torch.nn.Module, echo: Callable[[str], None]) -> None:
        """Copy the weights into ``model``; the head (or, under a pretrained encoder, the decoder) may be
        new, and the source's head is left out."""
        weights, new_parts, what = self.weights, ("head.",), "head"
        if self._warm_starts_encoder(model.config):
            weights, new_parts, what = self._as_encoder_decoder(), NEW_UNDER_ENCODER, "new decoder"
        missing, unexpected = load_weights(model, weights)
        body_missing = [name for name in missing if not name.startswith(new_parts)]
        if body_missing:
            raise ConfigError(
                f"train.init_from={self.source!r} lacks weights this model needs: {body_missing[:3]}"
            )
        new = f"; new: {len(missing)} {what} tensors" if missing else ""
        left = f"; left out: {len(unexpected)} tensors of its head" if unexpected else ""
        echo(f"initialised from {self.source}: {len(weights) - len(unexpected)} tensors{new}{left}")

    def _as_encoder_decoder(self) -> dict[str, Tensor]:
        """An encoder-only model's weights under the encoder-decoder's names. The segment embedding
        of sentence A (the only one a source has) is added to the learned positions, which is the same
        sum; the head is left under its own name (and out)."""
        renamed = {}
        for name, tensor in self.weights.items():
            for theirs, ours in ENCODER_NAMES.items():
                if name.startswith(theirs):
                    name = ours + name[len(theirs) :]
                    break
            renamed[name] = tensor
        segments = renamed.pop("embed.token_types.weight", None)
        if segments is not None:
            if "src_pos.weight" not in renamed:
                raise ConfigError(
                    f"train.init_from={self.source!r}: its segment embedding can only be folded into "
                    "learned positions"
                )
            renamed["src_pos.weight"] = renamed["src_pos.weight"] + segments[0]
        return renamed


def read_pretrained(path: str | Path) -> Pretrained:
    """The model at ``path``: an HF model folder (its ``config.json`` has a ``model_type``) through
    :func:`attnkit.convert.from_hf`, otherwise an attnkit checkpoint or run directory."""
    from attnkit.convert import from_hf
    from attnkit.loading import load_for_inference

    folder = Path(path)
    if not folder.exists():
        raise ConfigError(f"train.init_from={str(path)!r}: no such checkpoint or model folder")
    config_file = folder / "config.json"
    is_hf = False
    # An unreadable config.json is reported by the attnkit loader below, which names the file.
    with contextlib.suppress(OSError, UnicodeDecodeError, json.JSONDecodeError):
        is_hf = "model_type" in json.loads(config_file.read_text(encoding="utf-8"))
    if is_hf:
        model, tokenizer = from_hf(folder)
    else:
        model, tokenizer, _ = load_for_inference(folder, prefer="best", pack=False)
    weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    return Pretrained(str(path), model.config, weights, tokenizer)
