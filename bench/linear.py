"""The linear map alone: ``attnkit.cpu.linear`` (oneDNN on CPU) against torch's ``F.linear``.

The shapes are the projections of the models the other benchmarks time: GPT-2 small (d_model 768,
d_ff 3,072, Q/K/V stacked into 2,304 rows, 50,257 output tokens), all-MiniLM-L6-v2 (384, 1,536,
30,522 tokens) and the Multi30k translation recipe (256, 1,024, 8,000 tokens); the rows are one token
(batch-1 generation), 5 (one sentence, beam 5), 32 and 160 (a batch of 32 and beam 5) and 1,024 (a
training batch). Same float32 inputs, same threads, forward only. Prints, per shape, both times and
``ours/F.linear time`` (below 1: ours faster), for ``linear`` (training and inference) and for a
``Linear`` whose weight :func:`pack_for_inference` keeps in oneDNN's layout (what ``attnkit
translate`` and ``generate`` load), then the largest difference of the outputs to float64. With
``--bf16``, also a ``Linear`` whose packed weight is bf16 (``decode.precision=bf16``: inputs rounded to
bf16, sums in float32, for the processor's bf16 units), and its own largest difference to float64
(bf16's rounding, not comparable to float32's).

Run: ``python bench/linear.py [--rows 1,5,32,160,1024] [--bf16]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timing import compare, make_parser, setup

from attnkit.cpu.linear import OneDNNLinear as Linear
from attnkit.cpu.linear import linear, onednn_applies

# (d_out, d_in) of the projections named in the docstring
SHAPES = {
    "gpt2 qkv": (2304, 768),
    "gpt2 ffn in": (3072, 768),
    "gpt2 ffn out": (768, 3072),
    "gpt2 vocab": (50257, 768),
    "minilm ffn in": (1536, 384),
    "minilm vocab": (30522, 384),
    "multi30k attn": (256, 256),
    "multi30k ffn in": (1024, 256),
    "multi30k vocab": (8000, 256),
}


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("--rows", default="1,5,32,160,1024", help="rows (tokens) multiplied per call")
    bf16_help = "also a packed bf16 weight (decode.precision=bf16)"
    parser.add_argument("--bf16", action="store_true", help=bf16_help)
    parser.set_defaults(rounds=5)
    args = parser.parse_args()
    print(setup(args), "float32 (and bf16 weights, if --bf16), forward with bias")
    worst, worst_bf16 = 0.0, 0.0
    for rows in (int(r) for r in args.rows.split(",")):
        for name, (d_out, d_in) in SHAPES.items():
            torch.manual_seed(0)
            x, weight, bias = (
                torch.randn(rows, d_in),
                torch.randn(d_out, d_in) * d_in**-0.5,
                torch.randn(d_out),
            )
            path = "oneDNN" if onednn_applies(x, weight) else "F.linear (too small to pay)"
            ours = {path: lambda x=x, w=weight, b=bias: linear(x, w, b)}
            layer = Linear(d_in, d_out)
            with torch.no_grad():
                layer.weight.copy_(weight), layer.bias.copy_(bias)
            if layer.pack_for_inference() and onednn_applies(x, weight, packed=True):
                ours["oneDNN with the packed weight"] = torch.no_grad()(lambda x=x, layer=layer: layer(x))
            bf16 = Linear(d_in, d_out)
            with torch.no_grad():
                bf16.weight.copy_(weight), bf16.bias.copy_(bias)
            if args.bf16 and bf16.pack_for_inference(torch.bfloat16) and bf16._packed_applies(x):
                ours["a packed bf16 weight"] = torch.no_grad()(lambda x=x, layer=bf16: layer(x))
            exact = F.linear(x.double(), weight.double(), bias.double())
            for label, fn in ours.items():
                compare(f"{name} {d_out}x{d_in}, {rows} rows, ours via {label}", fn,
                        lambda x=x, w=weight, b=bias: F.linear(x, w, b), "F.linear",
                        device="cpu", rounds=args.rounds, min_seconds=0.05)  # fmt: skip
                error = (fn().double() - exact).abs().max().item()
                if label == "a packed bf16 weight":
                    worst_bf16 = max(worst_bf16, error)
                else:
                    worst = max(worst, error)
    with_bf16 = f"; with bf16 weights {worst_bf16:.2e}" if args.bf16 else ""
    print(f"largest |ours - float64| = {worst:.2e}{with_bf16}")


if __name__ == "__main__":
    main()
