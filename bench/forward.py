"""Speed of attnkit's EncoderDecoder against ``torch.nn.Transformer`` with the same configuration.

The peer gets the same embedding (× √d_model), sinusoidal positions and tied output projection, so the
two differ only in the Transformer body. ``torch.nn.Transformer`` always ends its stacks with a
LayerNorm; the paper's post-LN model has none, so the peer's are replaced by identities and both do
the same arithmetic. The peer's single ``dropout`` acts on residuals, attention weights and FFN
activations, so ours is given the same rate at all three places (:func:`like_for_like`). Each case runs
in inference (eval, no grad) and training (dropout on, forward + backward) modes.

Run: ``python bench/forward.py [--preset paper-base]`` (``--device cuda`` on a GPU, bf16 there).
"""

from __future__ import annotations

import statistics
import warnings

import torch
from timing import compare, make_parser, resolve_dtype, setup
from torch import nn

from attnkit import TransformerConfig, build_transformer
from attnkit.attention.masks import causal_mask, to_torch_attn_mask
from attnkit.cpu import speed_up
from attnkit.nn import Embeddings, PositionalEncoding


def like_for_like(preset: str, dropout: float | None = None) -> TransformerConfig:
    """The preset with one dropout rate on residuals, attention weights and FFN activations, as
    ``torch.nn.Transformer(dropout=...)`` applies it (the preset's own rate when ``dropout`` is None)."""
    rate = TransformerConfig.from_preset(preset).dropout if dropout is None else dropout
    return TransformerConfig.from_preset(
        preset, dropout=rate, attention_dropout=rate, activation_dropout=rate
    )


def describe_dropout(config: TransformerConfig) -> str:
    return (f"dropout {config.dropout} on residuals, attention weights and FFN activations "
            "(ours and the peer alike)")  # fmt: skip


class TorchTransformerPeer(nn.Module):
    """``torch.nn.Transformer`` between the same embedding, positions and tied output layer as ours."""

    def __init__(self, config: TransformerConfig, vocab: int) -> None:
        super().__init__()
        self.embed = Embeddings(vocab, config.d_model, config.pad_id)
        self.positions = PositionalEncoding(config.d_model, config.dropout)
        self.transformer = nn.Transformer(
            config.d_model, config.h, config.encoder_layers, config.decoder_layers, config.d_ff,
            config.dropout, batch_first=True, norm_first=config.norm_first,
        )  # fmt: skip
        if not config.norm_first:
            self.transformer.encoder.norm = nn.Identity()
            self.transformer.decoder.norm = nn.Identity()
        self.generator = nn.Linear(config.d_model, vocab, bias=False)
        self.generator.weight = self.embed.lut.weight
        self.pad_id = config.pad_id

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        src_padding = src == self.pad_id
        tgt_causal = to_torch_attn_mask(causal_mask(tgt.size(1), device=tgt.device))
        hidden = self.transformer(
            self.positions(self.embed(src)), self.positions(self.embed(tgt)),
            tgt_mask=tgt_causal, src_key_padding_mask=src_padding, memory_key_padding_mask=src_padding,
            tgt_is_causal=True,
        )  # fmt: skip
        return self.generator(hidden)


def _batch(batch: int, length: int, vocab: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab, (batch, length), generator=g)
    tgt = torch.randint(4, vocab, (batch, length), generator=g)
    for b in range(batch):  # sentences of varied length, as a length-bucketed batch would hold
        src[b, length - (b * length) // (3 * batch) :] = 0
    return src.to(device), tgt.to(device)


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("--preset", default="paper-base")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--shapes", default="16x32,8x64", help="batch x length, comma-separated")
    parser.add_argument("--dropout", type=float, default=None, help="default: the preset's")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")  # the peer's fast path
    dtype = resolve_dtype(args)
    config = like_for_like(args.preset, args.dropout)
    print(setup(args), f"preset {args.preset}, vocab {args.vocab}, {describe_dropout(config)}")
    torch.manual_seed(0)
    ours = build_transformer(config, args.vocab).to(args.device, dtype)
    speed_up(ours)  # on a CPU, as attnkit's trainer and loader do (attnkit.cpu)
    peer = TorchTransformerPeer(config, args.vocab).to(args.device, dtype)
    ratios = []
    for shape in args.shapes.split(","):
        batch, length = (int(n) for n in shape.split("x"))
        src, tgt = _batch(batch, length, args.vocab, args.device)
        tokens = batch * length * 2

        def infer(model, src=src, tgt=tgt):
            model.eval()
            with torch.inference_mode():
                return model(src, tgt)

        def train(model, src=src, tgt=tgt):
            model.train()
            logits = model(src, tgt)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten())
            loss.backward()
            model.zero_grad(set_to_none=True)

        for mode, step in (("inference", infer), ("training step", train)):
            ratios.append(
                compare(
                    f"{args.preset} B={batch} T={length} {mode}",
                    lambda step=step: step(ours),
                    lambda step=step: step(peer),
                    "torch_transformer",
                    device=args.device,
                    rounds=args.rounds,
                    tokens=tokens,
                )
            )
    print(f"median EncoderDecoder/torch_transformer time = {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
