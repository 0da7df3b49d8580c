"""The attention family: scores, normalisers, masks, ``attend`` and multi-head attention.

Nothing here knows about models; ``attnkit.nn`` builds layers from these pieces.
"""

from attnkit.attention.functional import attend, attend_reference
from attnkit.attention.masks import (
    causal_mask,
    combine_masks,
    local_window_mask,
    padding_mask,
    subsequent_mask,
    target_mask,
)
from attnkit.attention.multihead import KVCache, MultiHeadAttention, MultiHeadedAttention
from attnkit.attention.normalisers import NORMALISERS
from attnkit.attention.recording import recording
from attnkit.attention.scores import BahdanauAdditive, LuongConcat, LuongGeneral, dot, scaled_dot

__all__ = [
    "NORMALISERS",
    "BahdanauAdditive",
    "KVCache",
    "LuongConcat",
    "LuongGeneral",
    "MultiHeadAttention",
    "MultiHeadedAttention",
    "attend",
    "attend_reference",
    "causal_mask",
    "combine_masks",
    "dot",
    "local_window_mask",
    "padding_mask",
    "recording",
    "scaled_dot",
    "subsequent_mask",
    "target_mask",
]
