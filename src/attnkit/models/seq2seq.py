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

        self.encoder = Encoder(
            [encoder_layer(c) for _ in range(c.encoder_layers)], c.d_model, c.norm_first, c.layer_norm_eps
        )
        self.decoder = Decoder(
            [DecoderLayer(c.d_model, attention(c), attention(c), feed_forward(c), **residual(c))
             for _ in range(c.decoder_layers)],
            c.d_model, c.norm_first, c.layer_norm_eps,
        )  # fmt: skip
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
            src_mask = padding_mask(src, self.config.pad_id)
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
    ) -> Tensor:
        """Decoder states ``(B, T, d_model)`` for target tokens ``tgt (B, T)``.

        ``tgt_mask=None`` means causal: with right-padded targets, padding only ever follows the real
        tokens, so the causal mask already hides it from them. With a ``cache`` (from :meth:`new_cache`),
        pass only the new tokens; they are placed after the positions already cached.
        """
        start = cache.positions() if cache is not None else 0
        if tgt_mask is None and tgt.size(1) > 1:  # one new token may see every position: no mask at all
            tgt_mask = causal_mask(tgt.size(1), start + tgt.size(1), device=tgt.device)
        x = self.tgt_pos(self.tgt_embed(tgt), start)
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
        self.src_mask = padding_mask(src, model.config.pad_id)  # (N, 1, S)
        self.memory = model.encode(src, self.src_mask) if memory is None else memory  # (N, S, d_model)
        self.cache = model.new_cache() if use_cache else None
        self.beams = 1  # consecutive rows per source
        self.src = src  # (N, S): the pointer-generator copies these ids
        self.pointer_keys = None if model.pointer is None else model.pointer.keys(self.memory)
        self.src_valid = self.src_mask  # (N, 1, S): one row per source, as memory, src and pointer_keys

    def next_logits(self, tokens: Tensor) -> Tensor:
        """``tokens (N, t)`` -> logits of the next token ``(N, V)`` (log-probabilities with
        ``model.copy``)."""
        new = tokens[:, len(self.cache) :] if self.cache is not None else tokens
        hidden = self.model.decode(self.memory, self.src_mask, new, cache=self.cache)[:, -1]  # (R, d_model)
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

    def keep(self, index: Tensor) -> None:
        """Keep rows ``index`` of any sources (search drops the finished ones, all beams of a source
        together): memories move too."""
        self.src_mask = self.src_mask.index_select(0, index)
        if self.cache is None:
            self._select_sources(index)
            return
        sources = index[:: self.beams] // self.beams  # the first beam of each kept source: its source
        self._select_sources(sources)
        for layer in self.cache.layers:
            layer.self_attn.reorder(index)
            layer.src_attn.reorder(sources)

    def repeat(self, times: int) -> None:
        """Each row becomes ``times`` consecutive rows (beam search's beams; at most once, before or
        after any step). With the cache the sources' memories, and their cross-attention keys and values
        (computed at the first step), stay one row per source; the target side's cache is repeated."""
        if self.beams != 1:
            raise ValueError(f"the rows are already repeated ({self.beams} per source)")
        rows = torch.arange(self.src_mask.size(0), device=self.src_mask.device).repeat_interleave(times)
        self.src_mask = self.src_mask.index_select(0, rows)  # (N·times, 1, S)
        self.beams = times
        if self.cache is None:
            self._select_sources(rows)  # memory (N·times, S, d_model)
            return
        self.cache.reorder(rows, sources_too=False)


def build_transformer(
    config: TransformerConfig | str, src_vocab: int, tgt_vocab: int | None = None
) -> EncoderDecoder:
    """The one way to build the paper's model: a config (or a preset's name) and vocabulary sizes."""
    if isinstance(config, str):
        config = TransformerConfig.from_preset(config)
    return EncoderDecoder(config, src_vocab, src_vocab if tgt_vocab is None else tgt_vocab)
