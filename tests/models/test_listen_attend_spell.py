"""Listen, Attend and Spell (models/listen_attend_spell.py): the pyramid shortens an utterance as
Chan et al. say (stacked frames, then halved at each layer); padding an utterance in a batch changes
none of its outputs; a searched transcript is the greedy argmax of full forward passes, given back in
the order of the utterances; the guided attention loss is Tachibana et al.'s over each row's real
characters and annotations; a small one learns to spell what it hears."""

import math

import pytest
import torch

from attnkit.config import DecodeConfig
from attnkit.decode.transcripts import padded_frames, transcribe
from attnkit.models.listen_attend_spell import ListenAttendSpell, ListenAttendSpellConfig, frame_lengths
from attnkit.tasks.speech import character_tokenizer
from tests.models.greedy_reference import greedy_by_full_passes


def _model(**changes) -> ListenAttendSpell:
    torch.manual_seed(0)
    config = ListenAttendSpellConfig.from_preset("las-tiny", n_mels=8, **changes)
    return ListenAttendSpell(config, 40).eval()


@pytest.mark.parametrize(("stack", "pyramid"), [(1, 0), (3, 1), (3, 2), (2, 3)])
def test_the_pyramid_keeps_one_annotation_for_every_stack_times_2_to_the_layers_frames(stack, pyramid):
    model = _model(stack=stack, pyramid=pyramid)
    frames = torch.randn(2, 50, 8)
    frames[1, 23:] = 0  # the second utterance is 23 frames long
    assert frame_lengths(frames).tolist() == [50, 23]
    annotations, lengths = model.encoder(frames, frame_lengths(frames))
    expected = [math.ceil(math.ceil(n / stack) / 2**pyramid) for n in (50, 23)]
    assert lengths.tolist() == expected and annotations.size(1) == expected[0]
    assert [model.config.annotations(n) for n in (50, 23)] == lengths.tolist()  # what the server counts
    assert annotations[1, expected[1] :].abs().max() == 0  # nothing past the second one's end


@pytest.mark.parametrize("attention", ["location", "bahdanau"])
def test_padding_an_utterance_in_a_batch_changes_none_of_its_outputs(attention):
    model = _model(attention=attention, stack=2)
    short, long = torch.randn(17, 8), torch.randn(40, 8)
    tgt = torch.randint(4, 40, (1, 6))
    alone = model(short[None], tgt)
    batched = model(padded_frames([short, long]), tgt.repeat(2, 1))
    torch.testing.assert_close(batched[0], alone[0], atol=1e-5, rtol=1e-5)
    weights = model.alignments(padded_frames([short, long]), tgt.repeat(2, 1))  # (2, T, S)
    real = math.ceil(17 / 2 / 2)
    assert weights[0, :, real:].abs().max() == 0 and torch.allclose(weights[0].sum(-1), torch.ones(6))


def test_a_searched_transcript_is_the_greedy_argmax_of_full_forward_passes_in_their_order():
    tokenizer = character_tokenizer()
    model = ListenAttendSpell(ListenAttendSpellConfig.from_preset("las-tiny", n_mels=8, max_len=6),
                              tokenizer.vocab_size).eval()  # fmt: skip
    utterances = [torch.randn(n, 8) for n in (30, 12, 45, 20)]
    found = transcribe(model, tokenizer, utterances, DecodeConfig(beam_size=1, batch_size=3))
    for utterance, heard in zip(utterances, found, strict=True):
        assert heard == greedy_by_full_passes(model, utterance[None], tokenizer, limit=6)
    assert len(transcribe(model, tokenizer, utterances, DecodeConfig(beam_size=3))) == 4


def guided_attention_loss(weights, characters, annotations, strength, width):
    """Tachibana et al. (2018, §4.1) in float64, a weight at a time: ``λ Σ_n Σ_t A_nt W_nt`` with
    ``W_nt = 1 - exp(-(n/N - t/T)² / 2g²)``, over each row's ``N`` characters and ``T`` annotations."""
    total = 0.0
    for row, (N, T) in enumerate(zip(characters, annotations, strict=True)):
        for n in range(N):
            for t in range(T):
                W = 1 - math.exp(-((n / N - t / T) ** 2) / (2 * width**2))
                total += float(weights[row, n, t]) * W
    return strength * total


def test_the_guided_attention_loss_is_tachibanas_over_each_rows_real_characters_and_annotations():
    model = _model(stack=2, guided_attention=1.5, guided_width=0.3).train()  # las-tiny: no dropout
    frames = padded_frames([torch.randn(37, 8), torch.randn(20, 8)])
    tgt_in = torch.randint(4, 40, (2, 7))
    targets = tgt_in.clone()
    targets[1, 4:] = model.config.pad_id  # the second transcript predicts four tokens
    model(frames, tgt_in)
    penalty = model.attention_penalty(targets)
    weights = model.alignments(frames, tgt_in).double()  # (2, 7, S): the same weights
    annotations = [math.ceil(math.ceil(n / 2) / 2) for n in (37, 20)]  # stacked by 2, halved once
    expected = guided_attention_loss(weights, [7, 4], annotations, 1.5, 0.3)
    assert penalty.item() == pytest.approx(expected, rel=1e-5)
    assert model.attention_penalty(targets) == 0  # once per forward
    model(frames, tgt_in)
    model.attention_penalty(targets).backward()  # it trains the attention, not only measures it
    assert model.attention.score.w.weight.grad.abs().sum() > 0


def test_without_guided_attention_there_is_no_penalty_and_nothing_is_kept():
    model = _model(stack=2).train()
    tgt_in = torch.randint(4, 40, (2, 5))
    model(padded_frames([torch.randn(30, 8), torch.randn(12, 8)]), tgt_in)
    assert model._kept is None and model.attention_penalty(tgt_in) == 0
    guided = _model(stack=2, guided_attention=1.0)  # evaluating keeps nothing either
    guided(padded_frames([torch.randn(30, 8)]), tgt_in[:1])
    assert guided._kept is None


def test_a_small_listener_learns_to_spell_what_it_hears():
    """Four 'words', each a fixed pattern of frames, said at random speeds (frames repeated) in
    utterances of two: 300 steps of Adam, and greedy search spells held-out utterances right."""
    torch.manual_seed(0)
    tokenizer = character_tokenizer()
    words = {
        "ab": torch.randn(4, 8),
        "ba": torch.randn(4, 8),
        "cd": torch.randn(4, 8),
        "dc": torch.randn(4, 8),
    }

    def utterance(generator):
        said = [list(words)[int(i)] for i in torch.randint(0, 4, (2,), generator=generator)]
        speed = int(torch.randint(2, 4, (1,), generator=generator))
        frames = torch.cat([words[w].repeat_interleave(speed, 0) for w in said]) + 0.1 * torch.randn(
            8 * speed, 8
        )
        return frames, " ".join(said)

    config = ListenAttendSpellConfig.from_preset("las-tiny", n_mels=8, stack=2, max_len=8, d_hidden=48)
    model = ListenAttendSpell(config, tokenizer.vocab_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    specials, generator = tokenizer.specials, torch.Generator().manual_seed(1)
    for _ in range(300):
        batch = [utterance(generator) for _ in range(16)]
        ids = tokenizer.encode_batch([text for _, text in batch])
        tgt_in = torch.nn.utils.rnn.pad_sequence(
            [torch.tensor([specials.bos, *t]) for t in ids], batch_first=True, padding_value=specials.pad
        )
        tgt_out = torch.nn.utils.rnn.pad_sequence(
            [torch.tensor([*t, specials.eos]) for t in ids], batch_first=True, padding_value=specials.pad
        )
        logits = model.train()(padded_frames([f for f, _ in batch]), tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt_out, ignore_index=specials.pad)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    held_out = [utterance(torch.Generator().manual_seed(100 + i)) for i in range(8)]
    heard = transcribe(model, tokenizer, [f for f, _ in held_out], DecodeConfig(beam_size=1))
    assert heard == [text for _, text in held_out]
