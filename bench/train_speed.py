"""Training-step speed: attnkit's EncoderDecoder against ``torch.nn.Transformer``, same everything else.

One step = zero_grad, forward, label-smoothed loss, backward, Adam(0.9, 0.98, 1e-9) step (torch's fused
kernel on both sides, as attnkit's training loop uses), on the same batch, with the same configuration,
embedding, positions and tied output layer (attnkit computes the
loss as its training does, fused with the output layer: ``generative_loss``; the peer is
``forward.TorchTransformerPeer``), and the same dropout at the same places on both sides
(``forward.like_for_like``). Prints target tokens/s of each and ``ours/torch_transformer tok/s`` (above
1.0 = ours trains faster). ``--compile`` applies ``torch.compile`` to both. ``--precision bf16`` trains
both as ``attnkit train`` does with ``train.precision=bf16``: float32 weights and optimizer, the steps
under bf16 autocast (``--dtype bfloat16`` instead casts the models' weights).

Run: ``python bench/train_speed.py [--preset small] [--batch 32x32] [--precision bf16]`` (``--device
cuda`` on a GPU).
"""

from __future__ import annotations

import torch
from forward import TorchTransformerPeer, describe_dropout, like_for_like
from timing import compare, make_parser, resolve_dtype, setup

from attnkit import build_transformer
from attnkit.cpu import speed_up
from attnkit.data.batching import make_batch
from attnkit.data.tokenizer import SpecialIds
from attnkit.tasks.losses import generative_loss, label_smoothed_loss

SPECIALS = SpecialIds(pad=0, unk=1, bos=2, eos=3)  # the random batches below use ids 4 and up


def _batch(batch: int, length: int, vocab: int, device: str):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(length // 2, length + 1, (batch, 2), generator=g).tolist()
    src = [torch.randint(4, vocab, (s,), generator=g).tolist() for s, _ in lengths]
    tgt = [torch.randint(4, vocab, (t,), generator=g).tolist() for _, t in lengths]
    return make_batch(src, tgt, SPECIALS).to(device)


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch", default="32x32", help="sentences x longest length")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--dropout", type=float, default=None, help="default: the preset's")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast")
    args = parser.parse_args()
    autocast = torch.autocast(args.device.split(":")[0], torch.bfloat16, enabled=args.precision == "bf16")
    dtype = resolve_dtype(args)
    config = like_for_like(args.preset, args.dropout)
    print(
        setup(args),
        f"preset {args.preset}, vocab {args.vocab}, batch {args.batch}, {describe_dropout(config)},",
        f"fused Adam, precision {args.precision}{' (autocast)' if args.precision == 'bf16' else ''}",
    )
    torch.manual_seed(0)
    models = {"ours": build_transformer(config, args.vocab), "peer": TorchTransformerPeer(config, args.vocab)}
    sentences, length = (int(n) for n in args.batch.split("x"))
    batch = _batch(sentences, length, args.vocab, args.device)
    steps = {}
    for name, model in models.items():
        model.to(args.device, dtype).train()
        if name == "ours":
            speed_up(model)  # on a CPU, as attnkit's trainer does (attnkit.cpu)
        forward = torch.compile(model) if args.compile else model
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)

        def step(forward=forward, optimizer=optimizer, name=name):
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                if name == "ours":  # as attnkit trains: the output layer and the loss fused
                    loss, _ = generative_loss(
                        forward, (batch.src, batch.tgt_in), batch.tgt_out, 0.1, SPECIALS.pad
                    )
                else:
                    logits = forward(batch.src, batch.tgt_in)
                    loss, _ = label_smoothed_loss(logits, batch.tgt_out, 0.1, SPECIALS.pad)
            (loss / batch.n_tokens).backward()
            optimizer.step()

        steps[name] = step
    label = f"{args.preset} training step B={sentences} T<={length}"
    ratio = compare(label, steps["ours"], steps["peer"], "torch_transformer", device=args.device,
                    rounds=args.rounds, tokens=batch.n_tokens)  # fmt: skip
    print(f"ours/torch_transformer tok/s = {1 / ratio:.3f}")


if __name__ == "__main__":
    main()
