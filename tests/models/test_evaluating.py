"""``evaluating(model)``: eval mode inside the block (no dropout), the former mode after it; a model
already in eval mode is not walked again (``eval()`` sets every module's flag, 0.5 ms for a small
Transformer, and a search of one sentence opened two such blocks)."""

import torch
from torch import nn

from attnkit.models import evaluating


def _model():
    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)))


def _modes(model):
    return {module.training for module in model.modules()}


def test_a_training_model_evaluates_without_dropout_inside_and_trains_again_after():
    model, x = _model(), torch.randn(8, 4)
    with evaluating(model):
        assert _modes(model) == {False}
        assert torch.equal(model(x), model(x))  # no dropout
    assert _modes(model) == {True}


def test_a_model_in_eval_mode_is_not_walked_and_stays_in_eval_mode(monkeypatch):
    model = _model().eval()
    walks = []
    for module in model.modules():
        monkeypatch.setattr(module, "train", lambda mode=True, m=module: walks.append((m, mode)))
    with evaluating(model):
        assert _modes(model) == {False}
    assert _modes(model) == {False} and walks == []


def test_a_model_with_one_module_left_training_is_put_in_eval_mode_inside():
    model = _model().eval()
    model[2][1].train()  # one dropout left training: the block must not keep it
    with evaluating(model):
        assert _modes(model) == {False}
