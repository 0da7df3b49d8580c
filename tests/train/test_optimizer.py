"""The training loop's optimizer: torch's fused AdamW kernel on CPU, with AdamW's arithmetic.

The reference is torch's own per-tensor AdamW (``foreach=False, fused=False``), whose loop is the
formula of Loshchilov & Hutter (2019) written out; the fused kernel must follow it step for step.
"""

from __future__ import annotations

import pytest
import torch

from attnkit.config import TrainConfig
from attnkit.train.optimizer import make_optimizer


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))


def test_cpu_training_uses_the_fused_adamw_and_it_follows_the_per_tensor_formula():
    t = TrainConfig(betas=[0.9, 0.98], eps=1e-9, weight_decay=0.1)
    ours_model, peer_model = _model(), _model()
    ours = make_optimizer(ours_model, t, torch.device("cpu"))
    assert all(group["fused"] for group in ours.param_groups)
    decayed = [p for p in peer_model.parameters() if p.dim() >= 2]
    kept = [p for p in peer_model.parameters() if p.dim() < 2]  # biases and LayerNorm gains: no decay
    groups = [{"params": decayed, "weight_decay": 0.1}, {"params": kept, "weight_decay": 0.0}]
    peer = torch.optim.AdamW(groups, lr=1.0, betas=(0.9, 0.98), eps=1e-9, foreach=False, fused=False)
    schedule = [1e-3, 5e-4, 2e-3, 1e-3, 1e-4]
    for step, lr in enumerate(schedule):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(step))
        for model, optimizer in ((ours_model, ours), (peer_model, peer)):
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad()
            model(x).square().sum().backward()
            optimizer.step()
    for got, want in zip(ours_model.parameters(), peer_model.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_layer_decay_gives_each_encoder_layer_its_own_learning_rate():
    from attnkit.models import build_model
    from attnkit.models.config import EncoderModelConfig
    from attnkit.train.schedules import make_scheduler

    model = build_model(EncoderModelConfig.from_preset("tiny-encoder", head="classify"), 30)
    L = len(model.encoder.layers)
    optimizer = make_optimizer(model, TrainConfig(layer_decay=0.5, weight_decay=0.01), torch.device("cpu"))
    make_scheduler(optimizer, lambda step: 2e-4)  # sets every group to its base rate times 2e-4
    rate = {id(p): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        # ELECTRA's layer-wise decay: lr · decay^(L + 1 - depth), the embeddings at depth 0, layer i at i + 1
        depth = 0 if name.startswith("embed.") else L + 1
        if name.startswith("encoder.layers."):
            depth = int(name.split(".")[2]) + 1
        assert rate[id(p)][0] == pytest.approx(2e-4 * 0.5 ** (L + 1 - depth)), name
        assert rate[id(p)][1] == (0.01 if p.dim() >= 2 else 0.0), name
    assert {g["lr"] for g in make_optimizer(model, TrainConfig(), torch.device("cpu")).param_groups} == {1.0}
