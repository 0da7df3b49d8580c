"""Checkpoints round-trip exactly, survive a kill while saving, and average correctly."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from attnkit import build_transformer
from attnkit.checkpoint import folder
from attnkit.checkpoint.average import average_checkpoints
from attnkit.checkpoint.folder import (
    list_checkpoints,
    load_model_weights,
    resolve_checkpoint,
    save_checkpoint,
)
from attnkit.checkpoint.trainer_state import load_trainer_state
from attnkit.config import load_run_config
from attnkit.cpu.linear import BF16_MIN_WEIGHTS
from attnkit.errors import AttnkitError
from attnkit.loading import load_for_inference, ready_for_inference
from attnkit.models.config import TransformerConfig


def _save(run, step, model, optimizer=None, **kw):
    state = {"step": step} if optimizer is not None else None
    return save_checkpoint(run, step, model=model, config={"note": "test"}, tokenizer_json="{}",
                                optimizer=optimizer, trainer_state=state, **kw)  # fmt: skip


def test_weights_optimizer_and_rng_round_trip_and_tied_weights_stay_tied(tmp_path):
    torch.manual_seed(0)
    model = build_transformer("tiny", 20)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randint(1, 20, (2, 5)), torch.randint(1, 20, (2, 4))).sum().backward()
    optimizer.step()
    path = _save(tmp_path, 7, model, optimizer)
    expected_random = torch.rand(3)  # drawn after the RNG state was saved

    loaded = build_transformer("tiny", 20)
    load_model_weights(loaded, path)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert loaded.generator.proj.weight is loaded.src_embed.lut.weight
    new_optimizer = torch.optim.Adam(loaded.parameters(), lr=1e-3)
    meta = load_trainer_state(path, new_optimizer)
    assert meta["step"] == 7
    assert torch.equal(torch.rand(3), expected_random)
    old_state, new_state = optimizer.state_dict()["state"], new_optimizer.state_dict()["state"]
    assert old_state.keys() == new_state.keys()
    for index, values in old_state.items():
        for key, value in values.items():
            assert torch.equal(value, new_state[index][key]), (index, key)


def test_pointers_name_complete_checkpoints_and_pruning_keeps_the_best(tmp_path):
    model = build_transformer("tiny", 20)
    _save(tmp_path, 1, model, is_best=True, keep_last=2)
    for step in (2, 3, 4):
        _save(tmp_path, step, model, keep_last=2)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["step-0000001", "step-0000003", "step-0000004"]
    assert resolve_checkpoint(tmp_path, "best").name == "step-0000001"
    assert resolve_checkpoint(tmp_path, "last").name == "step-0000004"
    with pytest.raises(AttnkitError, match="no checkpoint here"):
        resolve_checkpoint(tmp_path / "elsewhere")


def test_a_process_killed_while_saving_leaves_the_previous_checkpoint_intact(tmp_path):
    model = build_transformer("tiny", 20)
    _save(tmp_path, 1, model)
    before = load_file(str(tmp_path / "step-0000001" / "model.safetensors"))
    script = textwrap.dedent(f"""
        import os
        from attnkit import build_transformer
        import shutil
        from attnkit.checkpoint.average import average_checkpoints
        from attnkit.checkpoint.folder import save_checkpoint
        def die_mid_save(src, dst):  # the files are written; the process dies before the rename
            os._exit(9)
        os.replace = die_mid_save
        run = __import__("pathlib").Path({str(tmp_path)!r})
        save_checkpoint(run, 2, model=build_transformer("tiny", 20), config={{}}, tokenizer_json="{{}}")
    """)
    result = subprocess.run([sys.executable, "-c", script], check=False)
    assert result.returncode == 9
    assert resolve_checkpoint(tmp_path, "last").name == "step-0000001"
    after = load_file(str(tmp_path / "step-0000001" / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not (tmp_path / "step-0000002").exists()
    assert any(p.name.startswith(".step-0000002") for p in tmp_path.iterdir())  # the torn attempt, hidden


def test_a_failed_save_cleans_up_and_raises(tmp_path, monkeypatch):
    model = build_transformer("tiny", 20)
    _save(tmp_path, 1, model)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(folder, "save_model", broken)
    with pytest.raises(AttnkitError, match=r"step-0000002: cannot write there \(disk full\)"):
        _save(tmp_path, 2, model)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".step")] == []
    assert (tmp_path / "last").read_text(encoding="utf-8") == "step-0000001"


def test_averaging_gives_the_element_wise_mean(tmp_path):
    torch.manual_seed(0)
    models = [build_transformer("tiny", 20) for _ in range(3)]
    paths = [_save(tmp_path, i + 1, m, keep_last=5) for i, m in enumerate(models)]
    out = average_checkpoints(paths, tmp_path / "avg")
    averaged = build_transformer("tiny", 20)
    load_model_weights(averaged, out)
    expected = torch.stack([m.encoder.layers[0].feed_forward.w_1.weight for m in models]).mean(0)
    torch.testing.assert_close(averaged.encoder.layers[0].feed_forward.w_1.weight, expected)
    assert json.loads((out / "config.json").read_text(encoding="utf-8")) == {"note": "test"}
    assert os.path.isfile(out / "tokenizer.json")


def test_checkpoints_get_the_users_usual_permissions_not_tempfiles_private_ones(tmp_path):
    old_mask = os.umask(0o022)
    try:
        path = _save(tmp_path, 1, build_transformer("tiny", 20))
        averaged = average_checkpoints([path], tmp_path / "avg")
    finally:
        os.umask(old_mask)
    assert path.stat().st_mode & 0o777 == 0o755
    assert averaged.stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "last").stat().st_mode & 0o777 == 0o644


def _replace_in_a_process_that_dies(tmp_path, kill_at: str, average: bool = False) -> int:
    """Save step 1 (or the average) again with new weights in a subprocess killed ``kill_at``:
    "between renames" (after the old copy was renamed aside) or "before delete" (after both renames)."""
    script = textwrap.dedent(f"""
        import os, pathlib, torch
        from attnkit import build_transformer
        import shutil
        from attnkit.checkpoint.average import average_checkpoints
        from attnkit.checkpoint.folder import save_checkpoint
        run = pathlib.Path({str(tmp_path)!r})
        renames = []
        real_replace = os.replace
        def replace(src, dst):
            renames.append(dst)
            if {kill_at!r} == "between renames" and len(renames) == 2:
                os._exit(9)
            real_replace(src, dst)
        def rmtree(path, ignore_errors=False):
            os._exit(9)
        def die_in_the_replacement():
            os.replace = replace
            if {kill_at!r} == "before delete":
                shutil.rmtree = rmtree
        torch.manual_seed(1)
        model = build_transformer("tiny", 20)
        if {average!r}:
            path = save_checkpoint(run, 2, model=model, config={{}}, tokenizer_json="{{}}", keep_last=9)
            die_in_the_replacement()
            average_checkpoints([path], run / "avg")
        else:
            die_in_the_replacement()
            save_checkpoint(run, 1, model=model, config={{}}, tokenizer_json="{{}}")
    """)
    return subprocess.run([sys.executable, "-c", script], check=False).returncode


@pytest.mark.parametrize("average", [False, True], ids=["checkpoint", "average"])
def test_a_process_killed_between_the_renames_of_a_replacement_leaves_the_old_copy(tmp_path, average):
    torch.manual_seed(0)
    model = build_transformer("tiny", 20)
    first = _save(tmp_path, 1, model)
    target = average_checkpoints([first], tmp_path / "avg") if average else first
    before = load_file(str(target / "model.safetensors"))
    assert _replace_in_a_process_that_dies(tmp_path, "between renames", average) == 9
    assert not target.exists()  # the kill came after the old copy was renamed aside ...
    found = resolve_checkpoint(tmp_path / "avg") if average else resolve_checkpoint(tmp_path, "last")
    assert found == target  # ... and the next reader puts it back
    after = load_file(str(found / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(p.name.endswith(".replaced") for p in tmp_path.iterdir())


def test_a_process_killed_after_the_swap_leaves_the_new_copy_and_the_old_is_cleaned_up(tmp_path):
    torch.manual_seed(0)
    _save(tmp_path, 1, build_transformer("tiny", 20))
    assert _replace_in_a_process_that_dies(tmp_path, "before delete") == 9
    torch.manual_seed(1)
    expected = build_transformer("tiny", 20).state_dict()
    assert (tmp_path / ".step-0000001.replaced").is_dir()
    found = list_checkpoints(tmp_path)
    assert [p.name for p in found] == ["step-0000001"]
    weights = load_file(str(found[0] / "model.safetensors"))
    assert torch.equal(weights["encoder.layers.0.feed_forward.w_1.weight"],
                       expected["encoder.layers.0.feed_forward.w_1.weight"])  # fmt: skip
    assert not (tmp_path / ".step-0000001.replaced").exists()


@pytest.fixture(scope="module")
def dates_run(tmp_path_factory):
    from attnkit.config import load_run_config
    from attnkit.train.loop import Trainer

    folder = tmp_path_factory.mktemp("dates")
    config = load_run_config(None, [
        "model.preset=tiny", "data.task=dates", "data.tokenizer=char", "data.n_train=200", "data.n_valid=8",
        "train.max_tokens=500", "train.max_steps=2", "train.eval_every=2", "decode.beam_size=4",
    ])  # fmt: skip
    Trainer(config, folder, echo=lambda message: None).fit()
    return folder


def test_one_loader_applies_the_precision_and_decode_overrides_for_every_command_and_the_server(dates_run):
    """What the CLI and the server load a model with: decode settings changed and checked, and the linear
    maps in the precision asked for (int8 weights, bf16 or float32 packed copies; bf16 and int8 on a CPU
    only), which the config returned names."""
    int8 = ["decode.beam_size=2", "decode.precision=int8"]
    model, _, config = load_for_inference(dates_run, overrides=int8)
    assert config.decode.beam_size == 2 and config.decode.precision == "int8"
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.int8_weight is not None and m.packed_weight is None for m in linears)
    bf16, _, config = load_for_inference(dates_run, overrides=["decode.precision=bf16"])
    linears = [m for m in bf16.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.numel() < BF16_MIN_WEIGHTS for m in linears)  # a toy model's maps
    assert all(m.packed_dtype == torch.float32 and m.int8_weight is None for m in linears)
    assert config.decode.precision == "fp32"  # every map kept float32, and the config says so
    wider = build_transformer(TransformerConfig.from_preset("tiny", d_model=256, d_ff=1024), 50)
    config = load_run_config(None, ["decode.precision=bf16"])
    linears = [m for m in ready_for_inference(wider, config).modules() if isinstance(m, torch.nn.Linear)]
    wanted = [torch.bfloat16 if m.weight.numel() >= BF16_MIN_WEIGHTS else torch.float32 for m in linears]
    assert torch.bfloat16 in wanted and [m.packed_dtype for m in linears] == wanted  # small maps: float32
    assert config.decode.precision == "bf16"
    packed, _, plain = load_for_inference(dates_run, overrides=["decode.precision=fp32"])
    assert plain.decode.beam_size == 4 and plain.decode.precision == "fp32"
    linears = [m for m in packed.modules() if isinstance(m, torch.nn.Linear)]
    assert all(m.int8_weight is None and m.packed_dtype == torch.float32 for m in linears)
    with pytest.raises(AttnkitError, match=r"decode\.beam_size must be >= 1"):
        load_for_inference(dates_run, overrides=["decode.beam_size=0"])
    with pytest.raises(AttnkitError, match=r"decode\.precision must be one of .*'bf16'.*; got 'fp16'"):
        load_for_inference(dates_run, overrides=["decode.precision=fp16"])
    for precision in ("int8", "bf16"):
        refused = rf"decode\.precision={precision} is for CPUs; this would run on cuda"
        with pytest.raises(AttnkitError, match=refused):
            load_for_inference(dates_run, "cuda", overrides=[f"decode.precision={precision}"])


def test_where_bf16_weights_cannot_be_packed_the_loader_says_float32(dates_run, monkeypatch):
    """The fallback: a torch whose oneDNN packs no bf16 weights serves float32, and the config says so."""
    from attnkit.cpu import linear

    monkeypatch.setattr(linear, "_packing_works", lambda dtype=torch.float32: dtype == torch.float32)
    model, _, config = load_for_inference(dates_run, overrides=["decode.precision=bf16"])
    assert config.decode.precision == "fp32"
    assert all(m.packed_dtype == torch.float32 for m in model.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize(("bf16_units", "resolved"), [(True, "bf16"), (False, "fp32")])
def test_auto_precision_follows_the_cpus_bf16_units_and_is_float32_on_a_gpu(monkeypatch, bf16_units,
                                                                             resolved):  # fmt: skip
    """decode.precision=auto: bf16 where the probe finds fast bf16 products (forced either way here, so
    that both are exercised on any machine), float32 where it does not and on a GPU; explicit settings as
    given, without probing."""
    from attnkit import loading
    from attnkit.cpu.precision import MatrixUnits

    units = MatrixUnits(bf16_units, 3.0 if bf16_units else 0.0, ("amx_bf16",) if bf16_units else (), ())
    monkeypatch.setattr(loading, "matrix_units", lambda: units)
    chosen, why = loading.inference_precision("auto", torch.device("cpu"))
    assert chosen == resolved and why.startswith("decode.precision=auto: this CPU has ")
    monkeypatch.setattr(loading, "matrix_units", lambda: pytest.fail("probed"))
    on_a_gpu = loading.inference_precision("auto", torch.device("cuda"))
    assert on_a_gpu == ("fp32", "decode.precision=auto on a CUDA")
    for given in ("fp32", "bf16", "int8"):
        assert loading.inference_precision(given, torch.device("cpu")) == (given, f"decode.precision={given}")
