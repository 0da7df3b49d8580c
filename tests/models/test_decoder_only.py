"""The GPT-style DecoderModel is causal; its KV cache and left padding change nothing."""

import torch

from attnkit.models import DecoderModel, build_model, from_preset


@torch.no_grad()
def cached_pass(model: DecoderModel, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    """The model's logits for ``ids``, computed as generation does: the first ``prompt`` tokens at
    once, then one token at a time through the KV cache."""
    caches = model.new_caches()
    steps = [model(ids[:, :prompt], caches=caches)]
    steps += [model(ids[:, t : t + 1], caches=caches) for t in range(prompt, ids.size(1))]
    return torch.cat(steps, dim=1)


def _model(seed=0, **overrides) -> DecoderModel:
    torch.manual_seed(seed)
    return build_model(from_preset("tiny-decoder", **overrides), 30).eval()


def test_a_position_never_sees_the_tokens_after_it():
    model = _model()
    ids = torch.randint(0, 30, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 30
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[:, :6], model(changed)[:, :6])
        assert not torch.allclose(model(ids)[:, 6:], model(changed)[:, 6:])


def test_step_by_step_with_the_kv_cache_equals_the_full_forward_pass():
    for positions in ("learned", "sinusoidal"):
        model = _model(positions=positions)
        ids = torch.randint(0, 30, (3, 12))
        with torch.no_grad():
            full = model(ids)
        torch.testing.assert_close(cached_pass(model, ids, prompt=5), full, atol=1e-5, rtol=1e-5)


def test_a_left_padded_batch_gives_each_row_what_it_gives_alone():
    model = _model(seed=1)
    rows = [torch.randint(1, 30, (n,)) for n in (7, 4, 1)]
    ids = torch.zeros(3, 7, dtype=torch.long)
    valid = torch.zeros(3, 7, dtype=torch.bool)
    for r, row in enumerate(rows):
        ids[r, 7 - len(row) :], valid[r, 7 - len(row) :] = row, True
    positions = (valid.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        batched = model(ids, valid, positions)
        for r, row in enumerate(rows):
            alone = model(row[None])[0]
            torch.testing.assert_close(batched[r, 7 - len(row) :], alone, atol=1e-5, rtol=1e-5)


def test_the_output_projection_is_the_token_embedding_and_init_is_gpt2s():
    model = build_model(from_preset("tiny-decoder", layers=4), 30)
    assert model.generator.proj.weight is model.embed.lut.weight
    w_2 = model.decoder.layers[0].feed_forward.w_2.weight
    w_1 = model.decoder.layers[0].feed_forward.w_1.weight
    assert abs(w_1.std().item() - 0.02) < 0.004  # N(0, 0.02)
    assert abs(w_2.std().item() - 0.02 / (2 * 4) ** 0.5) < 0.002  # residual projections / √(2N)
