"""Encoder and decoder stacks (Vaswani et al., 2017, §3.1, Figure 1).

Class names are the boxes of the Annotated Transformer (EncoderLayer, DecoderLayer, Encoder, Decoder),
so its readers find each piece; the arithmetic is the paper's (post-LN by default, see residual.py).

- EncoderLayer: self-attention, then the feed-forward network, each inside a SublayerConnection.
- DecoderLayer: masked self-attention, attention over the encoder output ("src_attn"), feed-forward.

A GPT-style decoder-only model (Radford et al., 2018: "a multi-layer Transformer decoder" without the
encoder-decoder attention) stacks the *encoder* layer with a causal mask, pre-LN, and a KV cache for
generation: there is no third kind of layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from attnkit.attention.multihead import KVCache, MultiHeadAttention
from attnkit.nn.feedforward import PositionwiseFeedForward
from attnkit.nn.residual import SublayerConnection


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each with residual + dropout + LayerNorm."""

    def __init__(
        self,
        d_model: int,
        self_attn: MultiHeadAttention,
        feed_forward: PositionwiseFeedForward,
        dropout: float = 0.0,
        norm_first: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.self_attn, self.feed_forward = self_attn, feed_forward
        self.sublayer = nn.ModuleList(SublayerConnection(d_model, dropout, norm_first, eps) for _ in range(2))

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        cache: KVCache | None = None,
        causal: bool = False,
    ) -> Tensor:
        """``causal``: each position attends only to itself and earlier ones (a GPT layer)."""
        x = self.sublayer[0](x, lambda y: self.self_attn(y, mask=mask, cache=cache, causal=causal)[0])
        return self.sublayer[1](x, self.feed_forward)


@dataclass
class LayerCache:
    """What one decoder layer keeps between decoding steps."""

    self_attn: KVCache = field(default_factory=KVCache)
    src_attn: KVCache = field(default_factory=KVCache)


class DecoderLayer(nn.Module):
    """Masked self-attention, attention over the memory, feed-forward; each with residual + LayerNorm."""

    def __init__(
        self,
        d_model: int,
        self_attn: MultiHeadAttention,
        src_attn: MultiHeadAttention,
        feed_forward: PositionwiseFeedForward,
        dropout: float = 0.0,
        norm_first: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.self_attn, self.src_attn, self.feed_forward = self_attn, src_attn, feed_forward
        self.sublayer = nn.ModuleList(SublayerConnection(d_model, dropout, norm_first, eps) for _ in range(3))

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        self_cache = cache.self_attn if cache is not None else None
        src_cache = cache.src_attn if cache is not None else None
        x = self.sublayer[0](x, lambda y: self.self_attn(y, mask=tgt_mask, cache=self_cache)[0])
        x = self.sublayer[1](x, lambda y: self.src_attn(y, memory, mask=src_mask, cache=src_cache)[0])
        return self.sublayer[2](x, self.feed_forward)


class Encoder(nn.Module):
    """A stack of N encoder layers; with pre-LN, a final LayerNorm (post-LN layers already end in one)."""

    def __init__(self, layers: list[EncoderLayer], d_model: int, norm_first: bool = False, eps: float = 1e-5):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(d_model, eps=eps) if norm_first else nn.Identity()

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        caches: list[KVCache] | None = None,
        causal: bool = False,
        valid: Tensor | None = None,
    ) -> Tensor:
        """``caches``: one self-attention KV cache per layer, for step-by-step causal use (GPT);
        ``causal``: every layer attends causally (see :func:`attnkit.attention.attend`). ``valid (B, T)``
        marks the real tokens, which ``mask`` lets attend: the stack computes every position, and what it
        gives at padding is read by nothing; a stack that skips padding may use it (attnkit.cpu's)."""
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, None if caches is None else caches[i], causal)
        return self.norm(x)


class DecoderCache:
    """Per-layer key/value caches of a decoder, for generating one token at a time."""

    def __init__(self, n_layers: int) -> None:
        self.layers = [LayerCache() for _ in range(n_layers)]

    def __len__(self) -> int:
        """Number of target positions already decoded."""
        return self.positions()

    def positions(self) -> int:
        """``len(self)``, traceable as a symbol (:meth:`KVCache.positions`)."""
        return self.layers[0].self_attn.positions() if self.layers else 0

    def reorder(self, index: Tensor, sources_too: bool = True) -> None:
        """Keep batch rows ``index`` in every layer (beam search re-ranking). ``sources_too=False`` leaves
        the cross-attention's keys and values alone, right when ``index`` only moves rows among rows with
        the same source (the beams of one sentence): copying them would change nothing."""
        for layer in self.layers:
            layer.self_attn.reorder(index)
            if sources_too:
                layer.src_attn.reorder(index)


class Decoder(nn.Module):
    """A stack of N decoder layers; with pre-LN, a final LayerNorm."""

    def __init__(self, layers: list[DecoderLayer], d_model: int, norm_first: bool = False, eps: float = 1e-5):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(d_model, eps=eps) if norm_first else nn.Identity()

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, src_mask, tgt_mask, None if cache is None else cache.layers[i])
        return self.norm(x)
