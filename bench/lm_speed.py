"""Decoder-only speed: attnkit's DecoderModel against HF ``GPT2LMHeadModel`` with the same weights.

Both sides are built at GPT-2 small's shape (``--preset gpt2``: 12 layers, 768 wide, 124M parameters)
with random weights (no download): ours from the preset, HF's converted from ours with ``to_hf_gpt2``,
so every weight is equal. HF uses its default attention (``sdpa``).

- Training step: forward, cross-entropy, backward, AdamW step (torch's fused kernel on both sides: what
  attnkit's training loop and HF's ``Trainer`` use by default), on the same batch of random tokens, with
  the same dropout (GPT-2's 0.1 on embeddings, residuals and attention weights) on both sides. Each side
  computes the loss as its training does: attnkit with ``generative_loss`` (the output layer and the
  cross-entropy fused, a few rows at a time), HF from its logits with ``F.cross_entropy`` (what
  ``GPT2LMHeadModel(labels=...)`` calls). Prints tokens/s and ``ours/hf_gpt2 train tok/s``.
- Generation: greedy, with the KV cache, ``--new-tokens`` tokens after prompts of ``--prompt-len``
  tokens, at each of ``--gen-batch``: ours (``attnkit.decode.search.extend``, its weights packed for
  inference as ``attnkit generate`` loads them; ``--no-pack``: not) against HF ``generate``; prints new
  tokens/s and ``ours/hf_generate tok/s``; and against CTranslate2's ``Generator`` on the same weights
  (``attnkit export --to ctranslate2``'s spec, one batch at a time on the same threads; float32, and with
  ``--precision bf16`` or ``int8`` its int8 too), where CTranslate2 is installed: ``ours/ctranslate2
  tok/s``, and whether its tokens are ours. ``--precision bf16|int8`` generates with our linear maps in
  bf16 (``attnkit generate --precision bf16``: bf16 copies of the weights for the processor's bf16
  units) or int8 (``--int8``), and prints how many of the generated tokens are float32's (random weights
  give flat distributions, whose argmax rounding flips more often than a trained model's).

Run: ``python bench/lm_speed.py [--generation-only] [--precision bf16]`` (``--device cuda`` on a GPU,
bf16 there).
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import torch
from timing import compare, make_parser, resolve_dtype, setup
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel

from attnkit.convert import hf_gpt2_config_kwargs, to_hf_gpt2
from attnkit.convert.export import export_ctranslate2
from attnkit.cpu import pack_for_inference, quantize_int8, speed_up
from attnkit.data.tokenizer import SpecialIds, Tokenizer
from attnkit.decode.search import argmax, extend
from attnkit.models import build_model, from_preset
from attnkit.tasks.losses import generative_loss


def ctranslate2_generator(model, vocab: int, folder: Path):
    """CTranslate2's ``Generator`` with ``model``'s weights, as ``attnkit export --to ctranslate2`` writes
    them, over made-up token names (id i is ``w{i}``, the last GPT-2's ``<|endoftext|>``), on torch's
    threads; None, with a note, without CTranslate2."""
    if importlib.util.find_spec("ctranslate2") is None:
        print("ctranslate2: not installed (pip install 'attnkit[ctranslate2]'), skipped")
        return None
    import ctranslate2

    names = {f"w{i}": i for i in range(vocab - 1)} | {"<|endoftext|>": vocab - 1}
    tokenizer = Tokenizer(HFTokenizer(WordLevel(names, unk_token="<|endoftext|>")))
    export_ctranslate2(model, tokenizer, {}, folder)
    return ctranslate2.Generator(str(folder), device="cpu", intra_threads=torch.get_num_threads())


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("--preset", default="gpt2")
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--batch", default="4x256", help="training batch: sequences x length")
    parser.add_argument("--gen-batch", default="1,32", help="generation batch sizes, comma-separated")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--no-pack", action="store_true", help="generate without pack_for_inference")
    parser.add_argument("--generation-only", action="store_true", help="skip the training step")
    precision_help = "CPU generation: our linear maps in fp32, bf16 or int8 (decode.precision)"
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8"), help=precision_help)
    args = parser.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel  # the peer; attnkit itself never imports it

    dtype = resolve_dtype(args)
    torch.manual_seed(0)
    ours = build_model(from_preset(args.preset), args.vocab)
    peer = GPT2LMHeadModel(GPT2Config(**hf_gpt2_config_kwargs(ours)))
    peer.load_state_dict(to_hf_gpt2(ours), strict=True)
    ours, peer = ours.to(args.device, dtype), peer.to(args.device, dtype)
    speed_up(ours)  # on a CPU, as attnkit's trainer and loader do (attnkit.cpu)
    c, size = ours.config, sum(p.numel() for p in ours.parameters()) / 1e6
    dropout = f"dropout {c.dropout} (embeddings, residuals), {c.attention_dropout} (attention)"
    print(setup(args), f"preset {args.preset} ({size:.1f}M), vocab {args.vocab}, {dropout}, fused AdamW")

    sequences, length = (int(n) for n in args.batch.split("x"))
    end = args.vocab - 1  # GPT-2's <|endoftext|>, attnkit's padding: never drawn below, so nothing is padding
    ids = torch.randint(0, end, (sequences, length + 1), device=args.device)
    if not args.generation_only:
        train_speed(ours, peer, ids, end, args)
    generation_speed(ours, peer, end, dtype, args)


def train_speed(ours, peer, ids: torch.Tensor, end: int, args) -> None:
    """One training step of each side on ``ids``, timed; prints ``ours/hf_gpt2 train tok/s``."""
    sequences, length = ids.size(0), ids.size(1) - 1
    steps = {}
    for name, model in (("ours", ours), ("peer", peer)):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # both trainers' default

        def step(model=model, optimizer=optimizer, name=name):
            model.train()
            optimizer.zero_grad(set_to_none=True)
            if name == "ours":
                loss, _ = generative_loss(model, (ids[:, :-1],), ids[:, 1:], 0.0, end)
                loss = loss / ids[:, 1:].numel()
            else:
                logits = model(input_ids=ids[:, :-1]).logits
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
            loss.backward()
            optimizer.step()

        steps[name] = step
    ratio = compare(f"{args.preset} training step B={sequences} T={length}", steps["ours"], steps["peer"],
                    "hf_gpt2", device=args.device, rounds=args.rounds, tokens=sequences * length)  # fmt: skip
    print(f"ours/hf_gpt2 train tok/s = {1 / ratio:.3f}")


def generation_speed(ours, peer, end: int, dtype: torch.dtype, args) -> None:
    """Greedy generation at each of ``--gen-batch``: ours against HF ``generate`` and CTranslate2."""
    specials = SpecialIds(pad=end, unk=end, bos=end, eos=end)
    scratch = tempfile.TemporaryDirectory()
    on_cpu = args.device == "cpu" and dtype == torch.float32  # CTranslate2 gets float32 weights on a CPU
    ct2 = ctranslate2_generator(ours, args.vocab, Path(scratch.name) / "ct2") if on_cpu else None
    engines = {"ctranslate2": ct2} if ct2 is not None else {}
    if ct2 is not None and args.precision != "fp32":  # its int8 from the same folder, as compute_type
        import ctranslate2

        engines["ctranslate2-int8"] = ctranslate2.Generator(
            str(Path(scratch.name) / "ct2"), device="cpu", compute_type="int8",
            intra_threads=torch.get_num_threads()
        )  # fmt: skip
    batches = [int(b) for b in args.gen_batch.split(",")]
    prompts_of = {b: torch.randint(0, end, (b, args.prompt_len), device=args.device) for b in batches}
    float32 = {}  # our float32 tokens, before the precision changes
    if args.precision != "fp32":
        float32 = {b: _greedy(ours, prompts_of[b], specials, args) for b in batches}
    if args.precision == "int8":
        print(f"generation: {quantize_int8(ours)} linear layers of ours with int8 weights")
    elif not args.no_pack:
        packed = speed_up(ours, inference=True).packed_weights  # as attnkit's loader does
        if args.precision == "bf16":
            packed = pack_for_inference(ours, torch.bfloat16)
        print(f"generation: {packed} linear layers of ours with packed {args.precision} weights")
    for batch in batches:
        prompts = prompts_of[batch]
        valid = torch.ones_like(prompts, dtype=torch.bool)
        limits = torch.full((batch,), args.new_tokens + 1, device=args.device)

        @torch.inference_mode()
        def ours_generate(prompts=prompts, valid=valid, limits=limits):
            ours.eval()
            return extend(ours.decoding(valid), prompts, limits, specials, argmax)

        @torch.inference_mode()
        def peer_generate(prompts=prompts, valid=valid):
            peer.eval()
            return peer.generate(input_ids=prompts, attention_mask=valid.long(), do_sample=False, num_beams=1,
                                 max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 pad_token_id=end, eos_token_id=end)  # fmt: skip

        label = f"greedy generation B={batch}, {args.prompt_len}+{args.new_tokens} tokens"
        ratio = compare(label, ours_generate, peer_generate, "hf_generate", device=args.device,
                        rounds=args.rounds, tokens=batch * args.new_tokens)  # fmt: skip
        print(f"ours/hf_generate tok/s (batch {batch}) = {1 / ratio:.3f}")
        ours_tokens = [row[: args.new_tokens] for row in ours_generate()]  # the weights CTranslate2 has
        if batch in float32:
            same = sum(a == b for mine, theirs in zip(ours_tokens, float32[batch], strict=True)
                       for a, b in zip(mine, theirs, strict=False))  # fmt: skip
            total = batch * args.new_tokens
            print(f"{args.precision}: {same} of {total} tokens are float32's (batch {batch})")
        names = [[f"w{i}" for i in row] for row in prompts.tolist()]
        for engine_name, engine in engines.items():

            def ct2_generate(names=names, engine=engine):
                # prompts of one length: CTranslate2 returns the continuations alone, new_tokens each
                return engine.generate_batch(names, max_length=args.new_tokens, min_length=args.new_tokens,
                                             sampling_topk=1, include_prompt_in_result=False)  # fmt: skip

            ratio = compare(label, ours_generate, ct2_generate, engine_name, device=args.device,
                            rounds=args.rounds, tokens=batch * args.new_tokens)  # fmt: skip
            print(f"ours/{engine_name} tok/s (batch {batch}) = {1 / ratio:.3f}")
            theirs = [result.sequences_ids[0] for result in ct2_generate()]
            print(f"the same tokens as {engine_name}: {ours_tokens == theirs}")


def _greedy(model, prompts: torch.Tensor, specials: SpecialIds, args) -> list[list[int]]:
    """``model``'s greedy continuations of ``prompts``, ``--new-tokens`` each."""
    with torch.inference_mode():
        model.eval()
        limits = torch.full((prompts.size(0),), args.new_tokens + 1, device=args.device)
        found = extend(model.decoding(torch.ones_like(prompts, dtype=torch.bool)), prompts, limits, specials,
                       argmax)  # fmt: skip
    return [row[: args.new_tokens] for row in found]


if __name__ == "__main__":
    main()
