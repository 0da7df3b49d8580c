"""A GPT-style decoder-only Transformer (Radford et al., 2018 and 2019), read top to bottom.

Tokens are embedded (unscaled), learned positions added, dropout applied; N layers of *causal*
self-attention and feed-forward follow, pre-LN, then a final LayerNorm; the output projection is the
token embedding itself. Radford et al. call the stack "a multi-layer Transformer decoder": the paper's
decoder without the encoder-decoder attention, which is exactly the paper's encoder layer with a causal
mask, so the stack is :class:`attnkit.nn.Encoder` (with a KV cache per layer for generation).

Prompts of different lengths are batched left-padded: each row's positions count only its real tokens
and padded keys are masked, so a batch generates exactly what each prompt generates alone.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from attnkit.attention.masks import causal_mask
from attnkit.attention.multihead import KVCache
from attnkit.models.config import DecoderModelConfig
from attnkit.models.decoding import CausalDecoding
from attnkit.models.layers import encoder_layer
from attnkit.models.seq2seq import Generator
from attnkit.nn.embedding import Embeddings, positional_encoding
from attnkit.nn.transformer import Encoder


class DecoderModel(nn.Module):
    """GPT: ``forward(ids) -> logits`` for causal language modelling; ``decoding`` for generation."""

    def __init__(self, config: DecoderModelConfig, vocab_size: int) -> None:
        super().__init__()
        c = config
        self.config, self.vocab_size = c, vocab_size
        self.embed = Embeddings(vocab_size, c.d_model, scale=c.scale_embeddings)
        self.positions = positional_encoding(c.positions, c.d_model, c.dropout, c.max_len, c.sinusoid_layout)

        # causal self-attention and FFN: the encoder layer with a causal mask (see the module docstring)
        self.decoder = Encoder(
            [encoder_layer(c) for _ in range(c.layers)], c.d_model, c.norm_first, c.layer_norm_eps
        )
        self.generator = Generator(c.d_model, vocab_size, bias=c.output_bias)
        self._init_weights()
        # a shallow draft decoder for speculative decoding (models/draft.py), set where one is loaded
        self.draft: nn.Module | None = None

    def _init_weights(self) -> None:
        """GPT-2's initialisation: N(0, 0.02) weights, zero biases, and the projections that write into
        the residual stream (attention output, second FFN layer) scaled down by √(2N) so that the
        stream's variance does not grow with depth; embeddings and positions keep their N(0, 0.02)."""
        for name, module in self.decoder.named_modules():
            if isinstance(module, nn.Linear):
                residual = name.endswith(("out_proj", "w_2"))
                std = 0.02 / math.sqrt(2 * self.config.layers) if residual else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if self.config.tie_output:
            self.generator.proj.weight = self.embed.lut.weight
        else:
            nn.init.normal_(self.generator.proj.weight, mean=0.0, std=0.02)

    def forward(
        self,
        ids: Tensor,
        key_valid: Tensor | None = None,
        positions: Tensor | None = None,
        caches: list[KVCache] | None = None,
        project: bool = True,
        decoder: Encoder | None = None,
    ) -> Tensor:
        """Next-token logits ``(B, T, V)`` for ``ids (B, T)``.

        ``key_valid (B, T_all)`` marks real tokens (False = left padding) among all positions so far;
        ``positions (B, T)`` gives each token's position (default ``start .. start+T-1``); with
        ``caches`` (from :meth:`new_caches`) pass only the new tokens, after those already cached.
        ``project=False`` returns the final states ``(B, T, d_model)`` instead, for a loss that applies
        :attr:`output_layer` itself (``attnkit.tasks.losses.projected_loss``). ``decoder``: another stack
        than the model's own (a shallow draft's, models/draft.py).
        """
        decoder = self.decoder if decoder is None else decoder
        start = len(caches[0]) if caches else 0
        x = self.positions(self.embed(ids), start, positions)
        if key_valid is None:  # no padding: the fused kernels' own causal masking, no mask tensor
            hidden = decoder(x, None, caches, causal=True)
        else:
            mask = causal_mask(ids.size(1), start + ids.size(1), device=ids.device) & key_valid.unsqueeze(-2)
            hidden = decoder(x, mask, caches)  # mask: (B, T, T_all)
        return self.generator(hidden) if project else hidden

    @property
    def output_layer(self) -> nn.Linear:
        """The pre-softmax linear map (the token embedding, when tied)."""
        return self.generator.proj

    def new_caches(self) -> list[KVCache]:
        """One empty self-attention KV cache per layer."""
        return [KVCache() for _ in range(self.config.layers)]

    def decoding(self, prompt_valid: Tensor, use_cache: bool = True) -> CausalDecoding:
        """Step-by-step decoding after left-padded prompts whose real tokens ``prompt_valid (B, P)`` marks."""
        return CausalDecoding(self, prompt_valid, use_cache)
