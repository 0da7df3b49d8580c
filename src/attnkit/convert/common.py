"""What every conversion needs: a field of an HF config (an object such as ``MarianConfig``, or a plain
dict), and loading mapped weights with a check that nothing was left out."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from attnkit.errors import ConversionError
from attnkit.models import load_weights

_MISSING = object()


def hf_field(hf_config: Any, name: str, default: Any = _MISSING) -> Any:
    """``hf_config.name`` or ``hf_config[name]``; ``default`` when absent (a KeyError without one)."""
    if isinstance(hf_config, Mapping):
        if name in hf_config or default is _MISSING:
            return hf_config[name]
        return default
    value = getattr(hf_config, name, default)
    if value is _MISSING:
        raise KeyError(name)
    return value


def config_size(hf_config: Any, expression: str) -> int | None:
    """A size an HF config gives: a field (``"hidden_size"``), a multiple of one (``"3*n_embd"``), the
    first of alternatives that is set (``"n_inner|4*n_embd"``) or a number (``"1"``); None where the
    config leaves it out."""
    for alternative in expression.split("|"):
        if alternative.isdigit():
            return int(alternative)
        factor, _, field = alternative.rpartition("*")
        value = hf_field(hf_config, field, None)
        if isinstance(value, int):
            return value * int(factor or 1)
    return None


def check_shapes(
    weights: Mapping[str, Tensor], hf_config: Any, expected: Mapping[str, tuple[str, ...]], where: str
) -> None:
    """Every weight whose name matches a pattern of ``expected`` has the sizes the config gives for it,
    dimension by dimension (``expected``: a name pattern -> one size expression per dimension, see
    :func:`config_size`), checked before any model is built: a mismatch is one line naming the field,
    the weight and both sizes (``where``: the folder, for the message)."""
    for name, tensor in weights.items():
        sizes = next((sizes for pattern, sizes in expected.items() if re.fullmatch(pattern, name)), None)
        if sizes is None:
            continue
        if tensor.dim() != len(sizes):
            raise ConversionError(
                f"{where}: model.safetensors's {name} has shape {tuple(tensor.shape)}; "
                f"config.json implies {len(sizes)} dimensions"
            )
        for axis, (expression, size) in enumerate(zip(sizes, tensor.shape, strict=True)):
            wanted = config_size(hf_config, expression)
            if wanted is not None and wanted != size:
                field = expression.split("|")[0]
                raise ConversionError(
                    f"{where}: config.json's {field} gives {wanted}, but model.safetensors's {name} has "
                    f"{size} (dimension {axis} of {tuple(tensor.shape)})"
                )


def load_mapped(model: nn.Module, weights: Mapping[str, Tensor], family: str) -> None:
    """Load ``weights`` (our names, mapped from ``family``'s) into ``model``: every parameter must be
    given (tied ones count as given with the tensor they share) and nothing else."""
    try:
        missing, unexpected = load_weights(model, weights)
    except RuntimeError as error:  # a size the shape check has no pattern for: still one line
        raise ConversionError(
            f"{family}: the weights do not fit the config ({_first_mismatch(error)})"
        ) from None
    if missing or unexpected:
        raise ConversionError(f"{family} mapping incomplete: missing {missing}, extra {unexpected}")


def require_full_softmax_attention(config: Any, family: str) -> None:
    """HF's models attend with a softmax over every key: a model with another normaliser or a local
    window would convert to one that computes something else, so it is refused."""
    if config.attention_normaliser != "softmax" or config.attention_window:
        raise ConversionError(
            f"{family} attends with a softmax over all keys; this model has attention_normaliser="
            f"{config.attention_normaliser!r}, attention_window={config.attention_window}"
        )


def require_plain_output(config: Any, family: str) -> None:
    """The peers' decoders end in one projection to the vocabulary: a pointer-generator (``model.copy``)
    also copies source tokens, which they cannot, so it is refused."""
    if getattr(config, "copy", False):
        raise ConversionError(
            f"{family} has no copy mechanism; this model mixes in copies of source tokens (model.copy=true)"
        )


def require_paper_embeddings(config: Any, family: str) -> None:
    """The peers' encoder-decoders embed as the paper does (×√d_model, no LayerNorm): a model with BERT's
    embedding (warm-started from a BERT-style encoder) would convert to one that computes something else."""
    if not getattr(config, "scale_embeddings", True) or getattr(config, "embedding_norm", False):
        raise ConversionError(
            f"{family} scales embeddings by √d_model and has no embedding LayerNorm; this model has "
            f"scale_embeddings={config.scale_embeddings}, embedding_norm={config.embedding_norm}"
        )


def _first_mismatch(error: RuntimeError) -> str:
    """The first "size mismatch for NAME: ..." line of ``load_state_dict``'s long message."""
    lines = [line.strip() for line in str(error).splitlines() if "size mismatch" in line]
    return lines[0] if lines else str(error).splitlines()[0]
