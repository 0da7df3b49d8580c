"""Checkpoint averaging (the paper's §6.1): the element-wise mean of the weights, with the first
checkpoint's config and tokenizer."""

import json
import os

import torch

from attnkit import build_transformer
from attnkit.checkpoint.average import average_checkpoints
from attnkit.checkpoint.folder import CheckpointContents, load_model_weights, save_checkpoint


def _save(run, step, model):
    return save_checkpoint(run, step, CheckpointContents(model, {"note": "test"}, "{}"), keep_last=5)


def test_averaging_gives_the_element_wise_mean(tmp_path):
    torch.manual_seed(0)
    models = [build_transformer("tiny", 20) for _ in range(3)]
    paths = [_save(tmp_path, i + 1, m) for i, m in enumerate(models)]
    out = average_checkpoints(paths, tmp_path / "avg")
    averaged = build_transformer("tiny", 20)
    load_model_weights(averaged, out)
    expected = torch.stack([m.encoder.layers[0].feed_forward.w_1.weight for m in models]).mean(0)
    torch.testing.assert_close(averaged.encoder.layers[0].feed_forward.w_1.weight, expected)
    assert json.loads((out / "config.json").read_text(encoding="utf-8")) == {"note": "test"}
    assert os.path.isfile(out / "tokenizer.json")
