"""The Transformer captioner (models/caption_transformer.py): the attention map it shows is the heads'
average of what torch's own ``nn.MultiheadAttention`` computes with the same weights; its searched
captions are the greedy argmax of full forward passes, with and without the KV cache, and beam search
runs on it; a small one learns to caption scenes it trains on."""

import torch

from attnkit.config import DecodeConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.captions import caption
from attnkit.models.caption_transformer import CaptionTransformer, CaptionTransformerConfig
from tests.models.greedy_reference import greedy_by_full_passes

WORDS = ["a", "b", "c", "d"]


def _model(**changes) -> CaptionTransformer:
    torch.manual_seed(0)
    config = CaptionTransformerConfig.from_preset("caption-transformer-tiny", image_size=24, **changes)
    return CaptionTransformer(config, 12).eval()


def test_the_attention_map_is_torchs_multihead_attention_over_the_regions_heads_averaged():
    """The last decoder layer's attention over the regions, from its query input and the memory, as
    ``torch.nn.MultiheadAttention`` (same weights) computes it with its heads averaged."""
    model = _model(decoder_layers=2)
    images, tgt = torch.rand(3, 1, 24, 24), torch.randint(4, 12, (3, 5))
    attends = model.decoder.layers[-1].src_attn
    seen = {}
    handle = attends.register_forward_hook(lambda _module, args, _output: seen.update(query=args[0]))
    try:
        shown = model.alignments(images, tgt)  # (B, T, L)
    finally:
        handle.remove()
    memory = model.encode(images)  # (B, L, d)
    peer = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    with torch.no_grad():
        peer.in_proj_weight.copy_(attends.in_proj.weight)
        peer.in_proj_bias.copy_(attends.in_proj.bias)
    _, expected = peer(seen["query"], memory, memory, need_weights=True, average_attn_weights=True)
    assert shown.shape == (3, 5, 9)  # 24 px: a 3×3 grid of regions
    assert torch.allclose(shown, expected, atol=1e-6)


def test_a_searched_caption_is_the_greedy_argmax_of_full_forward_passes_cached_or_not():
    tokenizer = Tokenizer.train("word", [" ".join(WORDS)], vocab_size=12)
    model = _model(max_len=6)
    images = torch.rand(4, 1, 24, 24)
    found = caption(model, tokenizer, images, DecodeConfig(beam_size=1, batch_size=3))
    specials = tokenizer.specials
    for i in range(4):
        assert found[i] == greedy_by_full_passes(model, images[i : i + 1], tokenizer, limit=6)
    decoding = model.decoding(images, use_cache=False)
    cached = model.decoding(images)
    tokens = torch.full((4, 1), specials.bos)
    for _ in range(3):
        step = cached.next_logits(tokens)
        assert torch.allclose(step, decoding.next_logits(tokens), atol=1e-5)
        tokens = torch.cat([tokens, step.argmax(-1, keepdim=True)], 1)
    beamed = caption(model, tokenizer, images, DecodeConfig(beam_size=3))
    assert len(beamed) == 4 and all(set(c.split()) <= set(WORDS) for c in beamed)


def test_a_small_transformer_captioner_learns_the_captions_of_the_scenes_it_trains_on():
    """Eight generated 24×24 'scenes' (a bright square in one of four quadrants, captioned by where it
    is): 200 steps of Adam, and greedy search gives every caption back."""
    torch.manual_seed(0)
    places = ["a b", "a c", "b d", "c d"]
    tokenizer = Tokenizer.train("word", [" ".join(WORDS)], vocab_size=12)
    images = torch.zeros(8, 1, 24, 24)
    captions = []
    for i in range(8):
        top, left = divmod(i % 4, 2)
        images[i, 0, top * 12 + 2 : top * 12 + 10, left * 12 + 2 : left * 12 + 10] = 1.0
        captions.append(places[i % 4])
    model = _model(max_len=6).train()
    specials = tokenizer.specials
    ids = tokenizer.encode_batch(captions)
    tgt_in = torch.tensor([[specials.bos, *t] for t in ids])
    tgt_out = torch.tensor([[*t, specials.eos] for t in ids])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(200):
        logits = model(images, tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt_out)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert caption(model, tokenizer, images, DecodeConfig(beam_size=1)) == captions
