"""Two processes (torchrun, gloo) train exactly like one process with the same global batch."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from attnkit.train.checkpoint import resolve_checkpoint

COMMON = [
    "model.preset=tiny", "data.task=dates", "data.tokenizer=char", "data.n_train=400", "data.n_valid=8",
    "train.max_tokens=400", "train.schedule=constant", "train.lr=0.001", "train.warmup=1",
    "train.max_steps=4", "train.eval_every=4", "train.label_smoothing=0.1",
]  # fmt: skip


def _train(run_dir, update_freq, processes):
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
    ]
    command = [*launcher, "-m", "attnkit"] if processes > 1 else [sys.executable, "-m", "attnkit"]
    args = ["train", "--run-dir", str(run_dir), *COMMON, f"train.update_freq={update_freq}"]
    result = subprocess.run([*command, *args], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return load_file(str(resolve_checkpoint(run_dir, "last") / "model.safetensors")), result.stdout


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built in")
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
