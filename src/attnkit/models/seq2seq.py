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

from torch import Tensor, nn

from attnkit.attention.masks import causal_mask, padding_mask
from attnkit.errors import ConfigError
from attnkit.models.config import TransformerConfig
from attnkit.models.decoding import Seq2SeqDecoding
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
        # a shallow draft decoder for speculative decoding (models/draft.py), set where one is loaded
        self.draft: nn.Module | None = None

    def step_weights(self) -> dict[str, Tensor]:
        """The weights its decoding steps read, by name (a compiled step freezes them, and its key hashes
        them): all but its draft decoder's, which decodes with steps of its own."""
        return {name: w for name, w in self.state_dict().items() if not name.startswith("draft.")}

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
        decoder: Decoder | None = None,
    ):
        """``src (B, S)``, ``tgt (B, T)`` (the shifted-right target) -> logits ``(B, T, tgt_vocab)``
        (with ``model.copy``: log-probabilities); ``project=False``: the decoder's states
        ``(B, T, d_model)``, for a loss that applies :attr:`output_layer` itself
        (``attnkit.tasks.losses.projected_loss``); ``decoder``: as :meth:`decode`'s."""
        if src_mask is None:
            src_mask = self.source_mask(src)
        memory = self.encode(src, src_mask)
        hidden = self.decode(memory, src_mask, tgt, tgt_mask, decoder=decoder)
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
        decoder: Decoder | None = None,
    ) -> Tensor:
        """Decoder states ``(B, T, d_model)`` for target tokens ``tgt (B, T)``.

        ``tgt_mask=None`` means causal: with right-padded targets, padding only ever follows the real
        tokens, so the causal mask already hides it from them. With a ``cache`` (from :meth:`new_cache`),
        pass only the new tokens; they are placed after the positions already cached. ``positions (B,
        T)``: each token's position, where rows are at different ones (rows that joined a running batch
        at different steps: their caches are padded on the left, which ``tgt_mask`` then hides).
        ``decoder``: another stack than the model's own (a shallow draft's, models/draft.py).
        """
        start = cache.positions() if cache is not None else 0
        if tgt_mask is None and tgt.size(1) > 1:  # one new token may see every position: no mask at all
            tgt_mask = causal_mask(tgt.size(1), start + tgt.size(1), device=tgt.device)
        x = self.tgt_pos(self.tgt_embed(tgt), start, positions)
        return (self.decoder if decoder is None else decoder)(
            x if self.tgt_norm is None else self.tgt_norm(x), memory, src_mask, tgt_mask, cache
        )

    def new_cache(self) -> DecoderCache:
        """An empty key/value cache for incremental decoding with :meth:`decode`."""
        return DecoderCache(self.config.decoder_layers)

    def decoding(self, src: Tensor, use_cache: bool = True) -> Seq2SeqDecoding:
        """Step-by-step decoding of the sources ``src (N, S)`` (encoded once, now)."""
        return Seq2SeqDecoding(self, src, use_cache)


def build_transformer(
    config: TransformerConfig | str, src_vocab: int, tgt_vocab: int | None = None
) -> EncoderDecoder:
    """The one way to build the paper's model: a config (or a preset's name) and vocabulary sizes."""
    if isinstance(config, str):
        config = TransformerConfig.from_preset(config)
    return EncoderDecoder(config, src_vocab, src_vocab if tgt_vocab is None else tgt_vocab)
