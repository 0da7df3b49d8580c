"""The encoder-decoder Transformer of Vaswani et al. (2017), Figure 1.

Read top to bottom: the source is embedded (×√d_model, + positions, dropout) and encoded by N layers into
a memory; the target, shifted right, is embedded the same way and decoded by N layers attending to
itself (causally) and to the memory; the Generator projects the result to vocabulary logits. With a
shared vocabulary the source embedding, target embedding and output projection are one matrix (§3.4).
With ``model.copy`` a pointer-generator (nn/pointer.py) mixes those with copies of source tokens. With
``model.embedding_norm`` and without ``model.scale_embeddings`` both sides embed as BERT does
(LayerNorm of the unscaled token + position sum), for an encoder warm-started from a BERT-style one.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.attention.masks import causal_mask, padding_mask
from attnkit.attention.multihead import KVCache
from attnkit.errors import ConfigError
from attnkit.models.config import TransformerConfig
from attnkit.models.layers import attention, encoder_layer, feed_forward, residual
from attnkit.nn.embedding import EmbeddingNorm, Embeddings, positional_encoding
from attnkit.nn.pointer import PointerGenerator
from attnkit.nn.transformer import Decoder, DecoderCache, DecoderLayer, Encoder


class Generator(nn.Module):
    """The pre-softmax linear map ``(B, T, d_model) -> (B, T, vocab)``.

    Returns logits, not the Annotated Transformer's log-probabilities: the loss and the samplers take
    logits, and ``logits.log_softmax(-1)`` is one call away.
    """

    def __init__(self, d_model: int, vocab_size: int, bias: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)


def encoder_stack(c: TransformerConfig) -> Encoder:
    """The paper's encoder: ``c.encoder_layers`` layers of self-attention and feed-forward."""
    return Encoder(
        [encoder_layer(c) for _ in range(c.encoder_layers)], c.d_model, c.norm_first, c.layer_norm_eps
    )


def decoder_stack(c: TransformerConfig) -> Decoder:
    """The paper's decoder: ``c.decoder_layers`` layers of masked self-attention, attention over the
    memory and feed-forward."""
    return Decoder(
        [DecoderLayer(c.d_model, attention(c), attention(c), feed_forward(c), **residual(c))
         for _ in range(c.decoder_layers)],
        c.d_model, c.norm_first, c.layer_norm_eps,
    )  # fmt: skip


class EncoderDecoder(nn.Module):
    """The Transformer: ``forward(src, tgt) -> logits``; ``encode`` and ``decode`` for step-wise use."""

    def __init__(self, config: TransformerConfig, src_vocab: int, tgt_vocab: int) -> None:
        super().__init__()
        c = config
        if c.share_embeddings and src_vocab != tgt_vocab:
            raise ConfigError(
                f"model.share_embeddings needs one vocabulary, got src_vocab={src_vocab} and "
                f"tgt_vocab={tgt_vocab}; set share_embeddings=False for separate vocabularies"
            )
        self.config, self.src_vocab, self.tgt_vocab = c, src_vocab, tgt_vocab

        self.encoder = encoder_stack(c)
        self.decoder = decoder_stack(c)
        scale = c.scale_embeddings
        self.src_embed = Embeddings(src_vocab, c.d_model, c.pad_id, scale)
        self.tgt_embed = (
            self.src_embed if c.share_embeddings else Embeddings(tgt_vocab, c.d_model, c.pad_id, scale)
        )
        # dropout after the positions, or (BERT's embedding) after a LayerNorm of their sum
        pos_dropout = 0.0 if c.embedding_norm else c.dropout
        self.src_pos = positional_encoding(c.positions, c.d_model, pos_dropout, c.max_len, c.sinusoid_layout)
        self.tgt_pos = positional_encoding(c.positions, c.d_model, pos_dropout, c.max_len, c.sinusoid_layout)
        self.src_norm = EmbeddingNorm(c.d_model, c.dropout, c.layer_norm_eps) if c.embedding_norm else None
        self.tgt_norm = EmbeddingNorm(c.d_model, c.dropout, c.layer_norm_eps) if c.embedding_norm else None
        self.generator = Generator(c.d_model, tgt_vocab, bias=c.output_bias)
        self.pointer = PointerGenerator(c.d_model) if c.copy else None
        self._init_weights()

    def _init_weights(self) -> None:
        """Xavier-uniform linear maps and zero biases (as fairseq and the Annotated Transformer); the
        embeddings keep N(0, d_model^-0.5) from :class:`Embeddings`, and tying happens last."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if self.config.tie_output:
            self.generator.proj.weight = self.tgt_embed.lut.weight

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        project: bool = True,
    ):
        """``src (B, S)``, ``tgt (B, T)`` (the shifted-right target) -> logits ``(B, T, tgt_vocab)``
        (with ``model.copy``: log-probabilities); ``project=False``: the decoder's states
        ``(B, T, d_model)``, for a loss that applies :attr:`output_layer` itself
        (``attnkit.tasks.losses.projected_loss``)."""
        if src_mask is None:
            src_mask = self.source_mask(src)
        memory = self.encode(src, src_mask)
        hidden = self.decode(memory, src_mask, tgt, tgt_mask)
        if not project:
            return hidden
        if self.pointer is None:
            return self.generator(hidden)
        return self.pointer(self.generator(hidden), hidden, self.pointer.keys(memory), memory, src, src_mask)

    @property
    def copies(self) -> bool:
        """Whether the output mixes in copies of source tokens (``model.copy``): it is then no single
        projection of the decoder's states, and the loss takes :meth:`forward`'s log-probabilities."""
        return self.pointer is not None

    @property
    def output_layer(self) -> nn.Linear:
        """The pre-softmax linear map (the target embedding, when tied)."""
        return self.generator.proj

    def source_mask(self, src: Tensor) -> Tensor:
        """Which source positions may be attended to, ``(B, 1, S)``: the real tokens of ``src (B, S)``."""
        return padding_mask(src, self.config.pad_id)

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """``src (B, S)`` -> memory ``(B, S, d_model)``; ``src_mask`` as ``padding_mask(src, pad_id)``.
        Its position-wise layers skip the padding (``Encoder``'s ``valid``)."""
        valid = src != self.config.pad_id  # (B, S)
        x = self.src_pos(self.src_embed(src))
        return self.encoder(x if self.src_norm is None else self.src_norm(x), src_mask, valid=valid)

    def decode(
        self,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt: Tensor,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """Decoder states ``(B, T, d_model)`` for target tokens ``tgt (B, T)``.

        ``tgt_mask=None`` means causal: with right-padded targets, padding only ever follows the real
        tokens, so the causal mask already hides it from them. With a ``cache`` (from :meth:`new_cache`),
        pass only the new tokens; they are placed after the positions already cached. ``positions (B,
        T)``: each token's position, where rows are at different ones (rows that joined a running batch
        at different steps: their caches are padded on the left, which ``tgt_mask`` then hides).
        """
        start = cache.positions() if cache is not None else 0
        if tgt_mask is None and tgt.size(1) > 1:  # one new token may see every position: no mask at all
            tgt_mask = causal_mask(tgt.size(1), start + tgt.size(1), device=tgt.device)
        x = self.tgt_pos(self.tgt_embed(tgt), start, positions)
        return self.decoder(
            x if self.tgt_norm is None else self.tgt_norm(x), memory, src_mask, tgt_mask, cache
        )

    def new_cache(self) -> DecoderCache:
        """An empty key/value cache for incremental decoding with :meth:`decode`."""
        return DecoderCache(self.config.decoder_layers)

    def decoding(self, src: Tensor, use_cache: bool = True) -> Seq2SeqDecoding:
        """Step-by-step decoding of the sources ``src (N, S)`` (encoded once, now)."""
        return Seq2SeqDecoding(self, src, use_cache)


class Seq2SeqDecoding:
    """What search needs from an :class:`EncoderDecoder`: ``next_logits(tokens)`` for all target tokens
    so far (``<s>`` first; with the KV cache only the new ones are run) and ``reorder(index)``.

    ``reorder`` keeps each row's memory: search only ever reorders rows among the beams of one source,
    whose memories are identical; ``keep`` moves the memories too. With the cache, the cross-attention
    keys and values stay one row per source however many beams it has (``beams`` consecutive rows):
    attention reads them once per source (``MultiHeadAttention._shared``).
    """

    def __init__(
        self, model: EncoderDecoder, src: Tensor, use_cache: bool, memory: Tensor | None = None
    ) -> None:
        """``memory``: the sources' encoding where it is computed already (by a compiled first step)."""
        self.model = model
        self.src_mask = model.source_mask(src)  # (N, 1, S)
        self.memory = model.encode(src, self.src_mask) if memory is None else memory  # (N, S, d_model)
        self.cache = model.new_cache() if use_cache else None
        self.beams = 1  # consecutive rows per source
        self.src = src  # (N, S): the pointer-generator copies these ids
        self.pointer_keys = None if model.pointer is None else model.pointer.keys(self.memory)
        self.src_valid = self.src_mask  # (N, 1, S): one row per source, as memory, src and pointer_keys
        # (R,): where each row's first token is in the cache, once rows that started at other steps
        # have joined (merge); None while every row starts at position 0
        self.first: Tensor | None = None

    def next_logits(self, tokens: Tensor) -> Tensor:
        """``tokens (N, t)`` -> logits of the next token ``(N, V)`` (log-probabilities with
        ``model.copy``). After a :meth:`merge`, each row's tokens are right-aligned (padding first)."""
        new = tokens[:, len(self.cache) :] if self.cache is not None else tokens
        positions = tgt_mask = None
        if self.first is not None:  # rows at different positions: each its own, its padding hidden
            columns = torch.arange(tokens.size(1), device=tokens.device)  # (t,)
            positions = (columns[None, -new.size(1) :] - self.first[:, None]).clamp(min=0)  # (R, new)
            tgt_mask = (columns[None, None, :] >= self.first[:, None, None]) & (
                columns[None, -new.size(1) :, None] >= columns[None, None, :]
            )  # (R, new, t): its own tokens, none after the query
        hidden = self.model.decode(
            self.memory, self.src_mask, new, tgt_mask, cache=self.cache, positions=positions
        )[:, -1]  # (R, d_model)
        logits = self.model.generator(hidden)  # (R, V)
        if self.model.pointer is None:
            return logits
        M = self.memory.size(0)  # the rows of one source are consecutive: (R, ·) -> (M, R / M, ·)
        log_probs = self.model.pointer(
            logits.view(M, -1, logits.size(-1)), hidden.view(M, -1, hidden.size(-1)),
            self.pointer_keys, self.memory, self.src, self.src_valid,
        )  # fmt: skip
        return log_probs.view_as(logits)

    def _select_sources(self, rows: Tensor) -> None:
        """Keep (or repeat) the memories of sources ``rows``, with what the pointer reads of them."""
        self.memory = self.memory.index_select(0, rows)
        self.src, self.src_valid = self.src.index_select(0, rows), self.src_valid.index_select(0, rows)
        if self.pointer_keys is not None:
            self.pointer_keys = self.pointer_keys.index_select(0, rows)

    def reorder(self, index: Tensor) -> None:
        if self.cache is not None:  # beams of one source share its memory: only the target side moves
            self.cache.reorder(index, sources_too=False)
        if self.first is not None:
            self.first = self.first.index_select(0, index)

    def keep(self, index: Tensor) -> int:
        """Keep rows ``index`` of any sources (search drops the finished ones, all beams of a source
        together): memories move too. Returns how many leading positions were forgotten (after a
        :meth:`merge`: the padding of rows that have left)."""
        self.src_mask = self.src_mask.index_select(0, index)
        if self.cache is None:
            self._select_sources(index)
            return 0
        sources = index[:: self.beams] // self.beams  # the first beam of each kept source: its source
        self._select_sources(sources)
        for layer in self.cache.layers:
            layer.self_attn.reorder(index)
            layer.src_attn.reorder(sources)
        if self.first is None:
            return 0
        self.first = self.first.index_select(0, index)
        return self._forget_unused()

    def merge(self, other: Seq2SeqDecoding) -> None:
        """Add ``other``'s rows after these: sources that began later (continuous batching,
        decode/continuous.py), with as many rows per source and a KV cache each. The shorter cache is
        padded on the left, its rows' first positions noted (:attr:`first`), so that each row goes on
        at its own position with its own tokens; the sources are padded to the longer one's length."""
        if self.cache is None or other.cache is None or self.beams != other.beams:
            raise ValueError("only cached decodings with as many rows per source merge")
        T, T_other = len(self.cache), len(other.cache)
        first = torch.cat([self._firsts() + max(T_other - T, 0), other._firsts() + max(T - T_other, 0)])
        self._merge_sources(other)
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            # self-attention (R, h, T, d_k): padded on the left
            key = stacked(mine.self_attn.key, theirs.self_attn.key, 2, 0.0, left=True)
            mine.self_attn = KVCache(
                key, stacked(mine.self_attn.value, theirs.self_attn.value, 2, 0.0, left=True)
            )
        self.first = first

    def _merge_sources(self, other: Seq2SeqDecoding) -> None:
        """Add ``other``'s sources after these (:meth:`merge`): memories, masks, ids and the
        cross-attention's keys and values, padded on the right to the longer source."""
        pad_id = self.model.config.pad_id

        def sources(mine: Tensor, theirs: Tensor, fill: float, dim: int = 1) -> Tensor:  # along S, then N
            return stacked(mine, theirs, dim, fill)

        self.memory = sources(self.memory, other.memory, 0.0)  # (N, S, d_model)
        self.src = sources(self.src, other.src, pad_id)  # (N, S)
        self.src_valid = sources(self.src_valid, other.src_valid, False, dim=2)  # (N, 1, S)
        self.src_mask = sources(self.src_mask, other.src_mask, False, dim=2)  # (R, 1, S)
        if self.pointer_keys is not None:
            self.pointer_keys = sources(self.pointer_keys, other.pointer_keys, 0.0)
        assert self.cache is not None and other.cache is not None
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            key = sources(mine.src_attn.key, theirs.src_attn.key, 0.0, dim=2)  # (N, h, S, d_k)
            mine.src_attn = KVCache(key, sources(mine.src_attn.value, theirs.src_attn.value, 0.0, dim=2))

    def _firsts(self) -> Tensor:
        """Each row's first position in the cache (:attr:`first`, zeros before any merge)."""
        if self.first is not None:
            return self.first
        return torch.zeros(self.src_mask.size(0), dtype=torch.long, device=self.src_mask.device)

    def _forget_unused(self) -> int:
        """Drop the cached positions no row reads any more (those before every row's first): the
        padding of rows that have left; returns how many. Once no row has any, the steps mask nothing
        again."""
        assert self.first is not None
        unused = int(self.first.min()) if len(self.first) else 0
        if unused:
            self._drop_positions(unused)
        self.first = self.first - unused
        if not bool(self.first.any()):  # every row starts at position 0
            self.first = None
        return unused

    def _drop_positions(self, count: int) -> None:
        """Drop the first ``count`` positions of every row's self-attention cache."""
        assert self.cache is not None
        for layer in self.cache.layers:
            kept = layer.self_attn.key[:, :, count:], layer.self_attn.value[:, :, count:]
            layer.self_attn = KVCache(*kept)

    def repeat(self, times: int) -> None:
        """Each row becomes ``times`` consecutive rows (beam search's beams; at most once, before or
        after any step). With the cache the sources' memories, and their cross-attention keys and values
        (computed at the first step), stay one row per source; the target side's cache is repeated."""
        if self.beams != 1:
            raise ValueError(f"the rows are already repeated ({self.beams} per source)")
        rows = torch.arange(self.src_mask.size(0), device=self.src_mask.device).repeat_interleave(times)
        self.src_mask = self.src_mask.index_select(0, rows)  # (N·times, 1, S)
        self.beams = times
        if self.first is not None:
            self.first = self.first.index_select(0, rows)
        if self.cache is None:
            self._select_sources(rows)  # memory (N·times, S, d_model)
            return
        self.cache.reorder(rows, sources_too=False)


def stacked(first: Tensor, second: Tensor, dim: int, fill: float, left: bool = False) -> Tensor:
    """The rows of ``first`` then those of ``second``, the shorter padded with ``fill`` along ``dim``
    to the longer's size (after its entries, or ``left``: before them): what merging running batches
    does to sources (padded after), KV caches and tokens (padded before, so that the newest align)."""
    size = max(first.size(dim), second.size(dim))

    def padded(x: Tensor) -> Tensor:
        if x.size(dim) == size:
            return x
        shape = list(x.shape)
        shape[dim] = size - x.size(dim)
        padding = x.new_full(shape, fill)
        return torch.cat([padding, x] if left else [x, padding], dim=dim)

    return torch.cat([padded(first), padded(second)])


def build_transformer(
    config: TransformerConfig | str, src_vocab: int, tgt_vocab: int | None = None
) -> EncoderDecoder:
    """The one way to build the paper's model: a config (or a preset's name) and vocabulary sizes."""
    if isinstance(config, str):
        config = TransformerConfig.from_preset(config)
    return EncoderDecoder(config, src_vocab, src_vocab if tgt_vocab is None else tgt_vocab)
