"""Two processes (torchrun, gloo) train exactly like one process with the same global batch, draw
dropout from their own seeds, and resume exactly; too little data for the processes is an error."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from attnkit.checkpoint import resolve_checkpoint

pytestmark = pytest.mark.slow  # several processes each (the slow set)

needs_distributed = pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")

COMMON = [
    "model.preset=tiny", "data.task=dates", "data.tokenizer=char", "data.n_train=400", "data.n_valid=8",
    "train.max_tokens=400", "train.schedule=constant", "train.lr=0.001", "train.warmup=1",
    "train.max_steps=4", "train.eval_every=4", "train.label_smoothing=0.1",
]  # fmt: skip


def _launch(processes, *args, timeout=300):
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
    ]
    command = [*launcher, "-m", "attnkit"] if processes > 1 else [sys.executable, "-m", "attnkit"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout, check=False, encoding="utf-8"
    )


def _weights(run_dir):
    return load_file(str(resolve_checkpoint(run_dir, "last") / "model.safetensors"))


def _train(run_dir, update_freq, processes):
    result = _launch(
        processes, "train", "--run-dir", str(run_dir), *COMMON, f"train.update_freq={update_freq}"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return _weights(run_dir), result.stdout


@needs_distributed
def test_two_gloo_processes_equal_one_process_with_twice_the_accumulation(tmp_path):
    single, single_out = _train(tmp_path / "one", update_freq=2, processes=1)
    double, double_out = _train(tmp_path / "two", update_freq=1, processes=2)
    d_model = 32  # the tiny preset
    for name in single:
        a, b = double[name], single[name]
        if name.endswith("in_proj.bias"):
            # The key bias adds the same q·b_k to every score of a row, which softmax ignores: its true
            # gradient is 0, so what reaches Adam is rounding noise (different for 1 and 2 processes) that
            # Adam's normalisation turns into ±lr steps. Compare the query and value biases only.
            keep = torch.cat([torch.arange(d_model), torch.arange(2 * d_model, 3 * d_model)])
            a, b = a[keep], b[keep]
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)
    assert single_out.count("step 4 epoch") == double_out.count("step 4 epoch") == 1  # only rank 0 reports
    assert double_out.count("final validation") == 1


DROPOUT = [*COMMON[:-3], "model.dropout=0.1", "train.eval_every=3", "train.label_smoothing=0.1"]


@needs_distributed
def test_two_processes_with_dropout_resume_exactly_and_save_each_ranks_random_state(tmp_path):
    whole = _launch(2, "train", "--run-dir", str(tmp_path / "whole"), *DROPOUT, "train.max_steps=6")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    first = _launch(2, "train", "--run-dir", str(tmp_path / "split"), *DROPOUT, "train.max_steps=3")
    assert first.returncode == 0, first.stdout + first.stderr

    checkpoint = resolve_checkpoint(tmp_path / "split", "last")
    state = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    assert state["world_size"] == 2
    rng = load_file(str(checkpoint / "trainer_state.safetensors"))
    assert not torch.equal(rng["rng.0.torch"], rng["rng.1.torch"])  # each process its own dropout stream

    resumed = _launch(2, "train", "--resume", str(tmp_path / "split"), "train.max_steps=6")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "split")
    assert all(torch.equal(a[k], b[k]) for k in a)  # bit for bit


@needs_distributed
def test_fewer_batches_than_processes_is_an_error_not_an_endless_loop(tmp_path):
    result = _launch(2, "train", "--run-dir", str(tmp_path / "r"), *COMMON[:3], "data.n_train=1",
                     "data.n_valid=2", "train.max_steps=5", "train.eval_every=5", timeout=120)  # fmt: skip
    assert result.returncode != 0
    assert (
        "makes 1 batch(es) of at most train.max_tokens=4096 tokens, fewer than the 2 processes"
        in result.stderr
    )


PROBE = """
import json, os, sys
from attnkit.config import load_run_config
from attnkit.train.loop import Trainer

def threads():
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))

trainer = Trainer(load_run_config(None, sys.argv[2:]), sys.argv[1] + os.environ["RANK"], echo=lambda *a: None)
during = threads()
trainer.fit()
report = {"during": during, "after": threads()}
open(sys.argv[1] + os.environ["RANK"] + ".json", "w").write(json.dumps(report))
"""


@needs_distributed
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")
def test_a_finished_run_ends_its_process_group_and_gloo_threads_before_exit(tmp_path):
    """A group left alive is torn down at interpreter exit, where gloo's threads sometimes abort the
    process after a finished run (SIGABRT, 'terminate called without an active exception')."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE, encoding="utf-8")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    result = subprocess.run([*launcher, str(probe), str(tmp_path / "run"), *COMMON], capture_output=True,
                            text=True, timeout=300, check=False, encoding="utf-8")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    reports = [json.loads((tmp_path / f"run{rank}.json").read_text(encoding="utf-8")) for rank in range(2)]
    for report in reports:
        assert any("gloo" in name for name in report["during"])  # the probe sees gloo's threads at all
        assert not [name for name in report["after"] if "gloo" in name]
