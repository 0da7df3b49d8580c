"""The RNN encoder-decoder with Bahdanau / Luong / no attention: step-by-step decoding equals the
teacher-forced pass, padding changes nothing, and it trains and translates through the one trainer."""

import pytest
import torch
from typer.testing import CliRunner

from attnkit.cli import app
from attnkit.config import load_run_config
from attnkit.models import RNNConfig, build_model
from attnkit.models.rnn import ATTENTIONS
from attnkit.train.loop import Trainer


def _model(attention: str, cell: str = "gru", **fields) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(RNNConfig.from_preset("rnn-tiny", attention=attention, cell=cell, **fields), 20).eval()


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_step_by_step_decoding_with_reordering_equals_the_teacher_forced_pass(attention, cell):
    model = _model(attention, cell, layers=2)
    src = torch.randint(4, 20, (3, 7))
    src[1, 5:] = 0  # a padded source
    tgt = torch.randint(4, 20, (3, 6))
    with torch.no_grad():
        full = model(src, tgt)
        decoding = model.decoding(src)
        steps = [decoding.next_logits(tgt[:, : t + 1]) for t in range(3)]
        order = torch.tensor([2, 0, 1])  # the search reorders rows (beams); the state follows them
        decoding.reorder(order)
        steps += [decoding.next_logits(tgt[order, : t + 1]) for t in range(3, 6)]
    torch.testing.assert_close(torch.stack(steps[:3], 1), full[:, :3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.stack(steps[3:], 1), full[order, 3:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["bahdanau", "general", "none"])
def test_padding_a_source_changes_nothing(attention):
    model = _model(attention)
    src, tgt = torch.randint(4, 20, (1, 5)), torch.randint(4, 20, (1, 4))
    padded = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-6, rtol=1e-5)


def test_the_rnn_config_is_checked():
    with pytest.raises(Exception, match=r"model\.attention must be one of"):
        RNNConfig(attention="luong")
    with pytest.raises(Exception, match=r"model\.d_hidden must be even"):
        RNNConfig(d_hidden=5)


@pytest.mark.parametrize("attention", ["bahdanau", "dot"])
def test_an_attentional_rnn_learns_to_copy_and_translates_from_the_command_line(
    attention, copy_data, tmp_path
):
    run = tmp_path / "run"
    settings = ["model.arch=rnn", "model.preset=rnn-tiny", f"model.attention={attention}",
                "data.train=[train.src, train.tgt]", "data.valid=[valid.src, valid.tgt]",
                f"data.dir={copy_data}", "data.tokenizer=word", "train.max_steps=150", "train.eval_every=150",
                "train.schedule=constant", "train.warmup=0", "train.lr=1e-2", "train.max_tokens=512",
                "train.label_smoothing=0", "train.clip_norm=1"]  # fmt: skip
    scores = Trainer(load_run_config(None, settings), run, echo=lambda m: None).fit()
    assert scores["valid_accuracy"] >= 0.8, scores
    source = tmp_path / "source.txt"
    source.write_text("1 2 3\n7 7 5 9\n")
    result = CliRunner().invoke(app, ["translate", "--ckpt", str(run), "--beam", "3", "-i", str(source)])
    assert result.exit_code == 0, result.output
    outputs = result.stdout.splitlines()
    assert len(outputs) == 2 and outputs[0] == "1 2 3"  # (accuracy on held-out data is checked above)
