"""Two processes (torchrun, gloo) train exactly like one process with the same global batch, draw
dropout from their own seeds, and resume exactly; too little data for the processes is an error."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from attnkit.checkpoint.folder import resolve_checkpoint

pytestmark = pytest.mark.slow  # several processes each (the slow set)

needs_distributed = pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")

# float32 (auto trains in bf16 on a CPU with bf16 units): these tests hold process layouts to the same
# arithmetic, which bf16's rounding of differently summed gradients would blur
COMMON = [
    "train.precision=fp32", "model.preset=tiny", "data.task=dates", "data.tokenizer=char", "data.n_train=400",
    "data.n_valid=8",
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


def assert_same_weights(a, b, names, d_model=32):
    """``a[name]`` and ``b[name]`` within float tolerance for each of ``names`` (tiny preset: d_model 32)."""
    for name in names:
        x, y = a[name], b[name]
        if name.endswith("in_proj.bias"):
            # The key bias adds the same q·b_k to every score of a row, which softmax ignores: its true
            # gradient is 0, so what reaches Adam is rounding noise (different for any two ways of
            # summing) that Adam's normalisation turns into ±lr steps. Compare the query and value biases.
            keep = torch.cat([torch.arange(d_model), torch.arange(2 * d_model, 3 * d_model)])
            x, y = x[keep], y[keep]
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4, msg=name)


@needs_distributed
def test_two_gloo_processes_equal_one_process_with_twice_the_accumulation(tmp_path):
    single, single_out = _train(tmp_path / "one", update_freq=2, processes=1)
    double, double_out = _train(tmp_path / "two", update_freq=1, processes=2)
    assert_same_weights(double, single, single)
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


STORE_PROBE = """
import os, sys
from pathlib import Path
from attnkit.config import load_run_config
from attnkit.tasks import make_task
from attnkit.train.loop import Trainer

def logged_task(config, tokenizer, echo):  # every rank's preparation messages, into a file of its own
    with open(Path(sys.argv[2]) / f"rank{os.environ['RANK']}.txt", "w", encoding="utf-8") as log:
        return make_task(config, tokenizer, lambda message: log.write(message + "\\n"))

Trainer(load_run_config(None, sys.argv[3:]), sys.argv[1], echo=lambda *a: None, task=logged_task).fit()
"""


STORE_SETTINGS = ["model.preset=tiny", "data.train=[train.src, train.tgt]",
                  "data.valid=[valid.src, valid.tgt]",
                  "data.tokenizer=word", "train.max_tokens=512", "train.max_steps=3", "train.eval_every=3",
                  "model.dropout=0.1"]  # fmt: skip


def _probe_run(tmp_path, name, launcher, copy_data, launches=1, env=None):
    """The store probe under ``launcher`` (``launches`` copies of it at once: one per "machine"), with
    ``env`` added to the environment; returns each rank's preparation messages and the run's final
    weights."""
    probe = tmp_path / "probe.py"
    probe.write_text(STORE_PROBE, encoding="utf-8")
    logs = tmp_path / f"{name}-logs"
    logs.mkdir()
    settings = [*STORE_SETTINGS, f"data.dir={copy_data}", f"data.store={tmp_path / name / 'stores'}"]
    command = [*launcher, str(probe), str(tmp_path / name / "run"), str(logs), *settings]
    environment = {**os.environ, **(env or {})}
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  encoding="utf-8", env=environment) for _ in range(launches)]  # fmt: skip
    for process in processes:
        output = process.communicate(timeout=300)[0]
        assert process.returncode == 0, output
    messages = [(logs / f"rank{rank}.txt").read_text(encoding="utf-8") for rank in range(2)]
    return messages, _weights(tmp_path / name / "run")


@needs_distributed
def test_one_rank_builds_the_token_store_and_the_other_finds_it(copy_data, tmp_path):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    logs, _ = _probe_run(tmp_path, "one-machine", launcher, copy_data)
    assert "rows, built now)" in logs[0] and "built now" not in logs[1]
    assert "rows, built before)" in logs[1]
    assert len(list((tmp_path / "one-machine" / "stores").iterdir())) == 1


@needs_distributed
def test_two_machines_of_one_process_train_as_one_machine_of_two(copy_data, tmp_path):
    """Two launches of torchrun (two "machines", here both on 127.0.0.1) meeting through c10d
    rendezvous: the second machine's process finds the first's store (one file system here) and the
    run ends with the weights of one machine running two processes.

    torchrun gives each process one thread when a machine runs several (``OMP_NUM_THREADS=1``) and
    leaves a lone process all the cores; two threads split some sums differently (and, with two such
    processes on two cores, not always the same way), which moves the weights by more than 1e-6. So
    the two "machines" are given one thread each, as on the one machine: the comparison is of the
    rendezvous and the training, not of thread counts."""
    one = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    _, expected = _probe_run(tmp_path, "one-machine", one, copy_data)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    two = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=attnkit-test"]  # fmt: skip
    logs, weights = _probe_run(
        tmp_path, "two-machines", two, copy_data, launches=2, env={"OMP_NUM_THREADS": "1"}
    )
    assert "rows, built now)" in logs[0] and "rows, built before)" in logs[1]
    for name in expected:
        torch.testing.assert_close(weights[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)
