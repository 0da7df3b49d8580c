"""FSDP2 (``train.parallel=fsdp``) with two gloo processes: it trains like DDP, saves sharded
checkpoints that every command reads, and a run killed mid-way resumes to the uninterrupted result."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnkit.checkpoint.folder import read_weights, resolve_checkpoint
from attnkit.checkpoint.sharded import SHARDED
from tests.train.test_distributed import COMMON, DROPOUT, _launch, assert_same_weights, needs_distributed

pytestmark = [pytest.mark.slow, needs_distributed]  # several processes each (the slow set)

TWENTY = [*COMMON[:-2], "train.max_steps=20", "train.eval_every=5"]


def _weights(run_dir):
    return read_weights(resolve_checkpoint(run_dir, "last"))


def _assert_same_weights(a, b):
    """Within float tolerance; the paper's tied embeddings are stored under one of their names (each
    writer picks its own), so compare the names both have."""
    shared = sorted(set(a) & set(b))
    assert len(shared) >= len(a) - 2  # at most the two other names of the tied embedding differ
    assert_same_weights(a, b, shared)


def _losses(run_dir):
    rows = (run_dir / "metrics.csv").read_text(encoding="utf-8").splitlines()
    header = rows[0].split(",")
    return [
        {k: float(v) for k, v in zip(header, row.split(","), strict=True) if k.endswith("loss")}
        for row in rows[1:]
    ]


def test_twenty_fsdp_steps_give_ddp_losses_and_weights_in_sharded_checkpoints_all_commands_read(tmp_path):
    runs = {}
    for parallel in ("ddp", "fsdp"):
        run = tmp_path / parallel
        result = _launch(2, "train", "--run-dir", str(run), *TWENTY, f"train.parallel={parallel}")
        assert result.returncode == 0, result.stdout + result.stderr
        runs[parallel] = run
    ddp, fsdp = runs["ddp"], runs["fsdp"]
    for a, b in zip(_losses(ddp), _losses(fsdp), strict=True):  # four validations, every 5 steps
        assert a == pytest.approx(b, rel=1e-5)
    _assert_same_weights(_weights(ddp), _weights(fsdp))

    # the FSDP checkpoint holds one file of each part per process, and no whole model
    checkpoint = resolve_checkpoint(fsdp, "last")
    assert not (checkpoint / "model.safetensors").exists()
    files = json.loads((checkpoint / SHARDED / "files.json").read_text(encoding="utf-8"))
    assert sorted(name.split("/")[0] for name in files) == ["model", "model", "optimizer", "optimizer"]

    # translate, average and export read it as they read a one-file checkpoint
    source = tmp_path / "dates.txt"
    source.write_text("March 3, 2001\n12 June 1999\n", encoding="utf-8")
    outputs = {}
    for parallel, run in runs.items():
        translated = _launch(1, "translate", "--ckpt", str(run), "--input", str(source))
        assert translated.returncode == 0, translated.stderr
        outputs[parallel] = translated.stdout
    assert outputs["fsdp"] == outputs["ddp"] and len(outputs["fsdp"].splitlines()) == 2
    averaged = _launch(1, "average", "--run-dir", str(fsdp), "--last", "2", "--out", str(tmp_path / "avg"))
    assert averaged.returncode == 0, averaged.stderr
    middle = {k: (v + _weights(fsdp)[k]) / 2 for k, v in read_weights(fsdp / "step-0000015").items()}
    _assert_same_weights(middle, read_weights(tmp_path / "avg"))
    exported = _launch(1, "export", "--ckpt", str(fsdp), "--to", "hf", "--out", str(tmp_path / "hf"))
    assert exported.returncode == 0, exported.stderr

    # and a sharded run continues as one process (DDP's format) from its shards
    resumed = _launch(1, "train", "--resume", str(fsdp), "train.max_steps=25")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stdout and (fsdp / "step-0000025" / "model.safetensors").is_file()


def test_fsdp_with_bf16_and_accumulation_trains_close_to_float32(tmp_path):
    """Mixed precision: the layers compute with bf16 copies of the weights, the shards, gradient
    reduction and Adam stay float32; four steps land near the float32 run's loss."""
    losses = {}
    for precision in ("fp32", "bf16"):
        run = tmp_path / precision
        result = _launch(2, "train", "--run-dir", str(run), *COMMON, "train.parallel=fsdp",
                         "train.update_freq=2", f"train.precision={precision}")  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        losses[precision] = _losses(run)[-1]["valid_loss"]
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.02)


def _kill_with_children(pid):
    """SIGKILL to ``pid`` and its children (torchrun starts its workers in sessions of their own)."""
    children = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[1]) == pid:  # fields[1]: the parent's process id
            children.append(int(entry.name))
    for process in (*children, pid):
        os.kill(process, signal.SIGKILL)
    return children


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torchrun's workers in /proc")
def test_a_killed_fsdp_run_resumes_to_the_uninterrupted_weights(tmp_path):
    """SIGKILL to every process once a checkpoint past step 10 exists (wherever the run is then: maybe
    in the middle of writing its next shards), then --resume: bit for bit the run that was not killed."""
    settings = [*DROPOUT, "train.parallel=fsdp", "train.eval_every=5", "train.max_steps=60"]
    whole = _launch(2, "train", "--run-dir", str(tmp_path / "whole"), *settings)
    assert whole.returncode == 0, whole.stdout + whole.stderr

    run = tmp_path / "killed"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    process = subprocess.Popen([*launcher, "-m", "attnkit", "train", "--run-dir", str(run), *settings],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        last = run / "last"
        if last.is_file() and int(last.read_text(encoding="utf-8").split("-")[1]) >= 10:
            assert len(_kill_with_children(process.pid)) == 2  # the two workers
            break
        time.sleep(0.02)
    assert process.wait(timeout=60) == -signal.SIGKILL, "the run ended before it could be killed"
    killed_at = resolve_checkpoint(run, "last").name
    assert killed_at != "step-0000060"

    resumed = _launch(2, "train", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {run / killed_at}" in resumed.stdout
    a, b = _weights(tmp_path / "whole"), _weights(run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
