"""Special ids come from the tokenizer/config everywhere: a model whose vocabulary puts <pad>, <s> and
</s> at other ids batches, scores and decodes exactly like the same model in attnkit's own layout."""

import dataclasses
import json

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer

from attnkit import build_transformer
from attnkit.config import DecodeConfig
from attnkit.data.batching import make_batch
from attnkit.data.synthetic import copy
from attnkit.data.tokenizer import SpecialIds, Tokenizer
from attnkit.decode import Search, greedy
from attnkit.decode.translate import translate
from attnkit.models.seq2seq import EncoderDecoder
from attnkit.tasks.losses import label_smoothed_loss

VOCAB_MATRICES = ("src_embed.lut.weight", "tgt_embed.lut.weight", "generator.proj.weight")


def _model_and_tokenizer() -> tuple[EncoderDecoder, Tokenizer]:
    tokenizer = Tokenizer.train("word", copy(300, seed=0, max_length=6).src)
    torch.manual_seed(0)
    model = build_transformer("tiny", tokenizer.vocab_size).eval()
    with torch.no_grad():
        model.generator.proj.weight.mul_(4)  # sharper, more varied outputs than at initialisation
    return model, tokenizer


def _permuted(model: EncoderDecoder, tokenizer: Tokenizer) -> tuple[EncoderDecoder, Tokenizer]:
    """The same model and tokenizer with every id i renamed V-1-i: <pad> last, </s> at V-4, ..."""
    V = tokenizer.vocab_size
    rename = list(range(V - 1, -1, -1))
    data = json.loads(tokenizer.to_str())
    data["model"]["vocab"] = {token: rename[i] for token, i in data["model"]["vocab"].items()}
    for added in data["added_tokens"]:
        added["id"] = rename[added["id"]]
    permuted_tokenizer = Tokenizer(HFTokenizer.from_str(json.dumps(data)))
    config = dataclasses.replace(model.config, pad_id=permuted_tokenizer.specials.pad)
    permuted = build_transformer(config, V).eval()
    state = model.state_dict()
    for name in VOCAB_MATRICES:
        moved = torch.empty_like(state[name])
        moved[torch.tensor(rename)] = state[name]
        state[name] = moved
    permuted.load_state_dict(state)
    return permuted, permuted_tokenizer


def test_the_permuted_layout_really_moves_the_specials():
    model, tokenizer = _model_and_tokenizer()
    _, permuted_tokenizer = _permuted(model, tokenizer)
    V = tokenizer.vocab_size
    assert tokenizer.specials == SpecialIds(pad=0, unk=1, bos=2, eos=3)
    assert permuted_tokenizer.specials == SpecialIds(pad=V - 1, unk=V - 2, bos=V - 3, eos=V - 4)


@pytest.mark.parametrize("beam", [1, 3])
def test_a_model_with_another_vocabulary_layout_translates_the_same(beam):
    model, tokenizer = _model_and_tokenizer()
    permuted, permuted_tokenizer = _permuted(model, tokenizer)
    texts = copy(12, seed=5, max_length=6).src  # different lengths: batches hold padding
    decode = DecodeConfig(beam_size=beam, max_len_a=1.0, max_len_b=4, batch_size=5)
    expected = translate(model, tokenizer, texts, decode)
    assert expected != [""] * len(texts)
    assert translate(permuted, permuted_tokenizer, texts, decode) == expected


def test_a_model_with_another_vocabulary_layout_has_the_same_loss():
    model, tokenizer = _model_and_tokenizer()
    permuted, permuted_tokenizer = _permuted(model, tokenizer)
    pairs = copy(8, seed=6, max_length=6)
    losses = []
    for m, t in ((model, tokenizer), (permuted, permuted_tokenizer)):
        batch = make_batch(t.encode_batch(pairs.src), t.encode_batch(pairs.tgt), t.specials)
        with torch.no_grad():
            losses.append(label_smoothed_loss(m(batch.src, batch.tgt_in), batch.tgt_out, 0.1, t.specials.pad))
    torch.testing.assert_close(losses[0], losses[1])


def test_greedy_on_a_marian_vocabulary_layout_equals_hf_generate():
    transformers = pytest.importorskip("transformers", reason="HF transformers is the parity reference")
    from attnkit.convert import from_hf_marian

    V, pad, eos = 40, 39, 0  # Marian's layout: </s> first, <pad> last and also the decoder start
    torch.manual_seed(0)
    config = transformers.MarianConfig(
        vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, pad_token_id=pad,
        eos_token_id=eos, decoder_start_token_id=pad, max_position_embeddings=64, scale_embedding=True,
        init_std=0.3, attn_implementation="eager",
    )  # fmt: skip
    hf = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        hf.final_logits_bias[0, eos] = 3.0  # so that sentences end at different steps
    ours = from_hf_marian(hf.state_dict(), config).eval()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(1, V - 1, (6, 9), generator=g)
    for row, length in enumerate([9, 7, 5, 8, 3, 6]):
        src[row, length - 1] = eos
        src[row, length:] = pad
    bound = 12  # tokens including </s>, for every sentence (max_len_a = 0)
    with torch.no_grad():
        theirs = hf.generate(
            input_ids=src, attention_mask=(src != pad).long(), num_beams=1, do_sample=False,
            max_new_tokens=bound, forced_eos_token_id=eos, bad_words_ids=[[pad]], eos_token_id=eos,
            pad_token_id=pad, decoder_start_token_id=pad,
        )  # fmt: skip
    expected = []
    for row in theirs[:, 1:].tolist():  # without the decoder start token
        expected.append(row[: row.index(eos)] if eos in row else row)
    specials = SpecialIds(pad=pad, unk=1, bos=pad, eos=eos)
    ours_out = greedy(ours, src, specials, Search(max_len_a=0.0, max_len_b=bound))
    assert ours_out == expected
    assert len({len(t) for t in expected}) > 1  # some sentences ended early, others at the bound
