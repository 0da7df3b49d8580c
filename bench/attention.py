"""Speed of attnkit's attention against PyTorch's, same process, same inputs.

- ``attend`` (fast path) vs ``F.scaled_dot_product_attention``: the cost of our wrapper.
- ``MultiHeadAttention`` vs ``torch.nn.MultiheadAttention``: projections + attention, forward and
  forward+backward.

Run: ``python bench/attention.py`` (CPU here; ``--device cuda`` on a GPU, bf16 by default there).
Prints ``ours/peer time`` per case; below 1.0 means ours is faster.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
from timing import compare, make_parser, resolve_dtype, setup
from torch import nn

from attnkit.attention import MultiHeadAttention, attend, causal_mask, padding_mask
from attnkit.attention.masks import to_torch_attn_mask
from attnkit.cpu import speed_up


def _mask(kind: str, batch: int, length: int, device: str) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "causal":
        return causal_mask(length, device=device)
    ids = torch.ones(batch, length, dtype=torch.long, device=device)
    for b in range(batch):  # rows of decreasing length, the shortest half as long
        ids[b, length - (b * length) // (2 * batch) :] = 0
    return padding_mask(ids, 0)  # (B, 1, T)


def bench_attend(args, dtype) -> list[float]:
    ratios = []
    shapes = [(2, 2, 8, 4)] if args.quick else [(8, 8, 128, 64), (4, 8, 512, 64)]
    for batch, heads, length, d_k in shapes:
        q, k, v = (torch.randn(batch, heads, length, d_k, device=args.device, dtype=dtype) for _ in range(3))
        for kind in ("none", "padding", "causal"):
            mask = _mask(kind, batch, length, args.device)
            mask4 = None if mask is None else (mask.unsqueeze(1) if mask.dim() == 3 else mask)
            ratios.append(
                compare(
                    f"attend B={batch} h={heads} T={length} d_k={d_k} mask={kind}",
                    lambda q=q, k=k, v=v, m=mask4: attend(q, k, v, m),
                    lambda q=q, k=k, v=v, m=mask4: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                    "torch_sdpa",
                    device=args.device,
                    rounds=args.rounds,
                )
            )
    return ratios


def _mha_pair(d_model: int, heads: int, device: str, dtype: torch.dtype):
    peer = nn.MultiheadAttention(d_model, heads, batch_first=True).to(device, dtype)
    ours = MultiHeadAttention(d_model, heads).to(device, dtype)
    speed_up(ours)  # on a CPU, as attnkit's trainer and loader do (attnkit.cpu)
    with torch.no_grad():
        ours.in_proj.weight.copy_(peer.in_proj_weight)
        ours.in_proj.bias.copy_(peer.in_proj_bias)
        ours.out_proj.load_state_dict(peer.out_proj.state_dict())
    return ours, peer


def bench_multihead(args, dtype) -> list[float]:
    ratios = []
    d_model, heads = (16, 2) if args.quick else (512, 8)
    ours, peer = _mha_pair(d_model, heads, args.device, dtype)
    for batch, length in [(2, 8)] if args.quick else [(16, 64), (4, 256)]:
        x = torch.randn(batch, length, d_model, device=args.device, dtype=dtype)
        mask = _mask("padding", batch, length, args.device)
        key_padding = ~mask.squeeze(1)
        tokens = batch * length

        def ours_forward(x=x, mask=mask):
            with torch.inference_mode():
                return ours(x, mask=mask)

        def peer_forward(x=x, key_padding=key_padding):
            with torch.inference_mode():
                return peer(x, x, x, key_padding_mask=key_padding, need_weights=False)

        def ours_train(x=x, mask=mask):
            ours(x.requires_grad_(), mask=mask)[0].sum().backward()

        def peer_train(x=x, key_padding=key_padding):
            out, _ = peer(x.requires_grad_(), x, x, key_padding_mask=key_padding, need_weights=False)
            out.sum().backward()

        causal = causal_mask(length, device=args.device)
        torch_causal = to_torch_attn_mask(causal)

        def ours_causal_train(x=x, causal=causal):
            ours(x.requires_grad_(), mask=causal)[0].sum().backward()

        def peer_causal_train(x=x, torch_causal=torch_causal):
            peer(x.requires_grad_(), x, x, attn_mask=torch_causal, need_weights=False)[0].sum().backward()

        label = f"MultiHeadAttention d_model={d_model} h={heads} B={batch} T={length}"
        for mode, mine, theirs in [
            ("padding, inference", ours_forward, peer_forward),
            ("padding, forward+backward", ours_train, peer_train),
            ("causal, forward+backward", ours_causal_train, peer_causal_train),
        ]:
            ratios.append(
                compare(f"{label} {mode}", mine, theirs, "torch_mha", device=args.device, rounds=args.rounds,
                        tokens=tokens)
            )  # fmt: skip
    return ratios


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="tiny shapes: checks the script, measures nothing"
    )
    args = parser.parse_args()
    dtype = resolve_dtype(args)
    print(setup(args))
    torch.manual_seed(0)
    attend_ratios = bench_attend(args, dtype)
    mha_ratios = bench_multihead(args, dtype)
    print(f"median attend/torch_sdpa time = {statistics.median(attend_ratios):.3f}")
    print(f"median MultiHeadAttention/torch_mha time = {statistics.median(mha_ratios):.3f}")


if __name__ == "__main__":
    main()
