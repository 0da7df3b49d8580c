"""The Dockerfile builds a CPU image that serves a checkpoint folder mounted at run time: healthy once
the model is loaded, answering as ``attnkit translate`` does, stopped by ``docker stop`` with status 0.
Where no Docker engine runs (CI's machines and most laptops without one), skipped, saying so."""

import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the server tests need httpx: pip install 'attnkit[test]'")

pytestmark = pytest.mark.slow  # an image built, with PyTorch in it

REPO = Path(__file__).resolve().parents[2]


def _no_engine() -> str:
    """Why this machine cannot build an image ("" if it can)."""
    if shutil.which("docker") is None:
        return "no docker command on this machine"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, encoding="utf-8")
    if info.returncode != 0:
        return (
            "no Docker engine runs here (docker info: "
            + (info.stderr.strip().splitlines() or ["?"])[-1]
            + ")"
        )
    return ""


def _docker(*arguments: str) -> str:
    """What a docker command prints (its output and errors)."""
    done = subprocess.run(["docker", *arguments], capture_output=True, text=True, encoding="utf-8")
    return done.stdout + done.stderr


@pytest.mark.skipif(bool(_no_engine()), reason=_no_engine() or "a Docker engine runs")
def test_the_image_serves_a_mounted_checkpoint_as_the_cli_translates_and_stops_cleanly(run, tmp_path):
    sentence = "March 3, 2001"
    source = tmp_path / "one.txt"
    source.write_text(sentence + "\n", encoding="utf-8")
    command = ["translate", "--ckpt", str(run), "-i", str(source), "--beam", "1"]
    printed = subprocess.run([sys.executable, "-m", "attnkit", *command], capture_output=True, text=True,
                             encoding="utf-8", check=True)  # fmt: skip
    image, name = "attnkit-serve-test", f"attnkit-serve-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "build", "-t", image, str(REPO)], check=True, capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(["docker", "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", "-v",
                    f"{run}:/model:ro", image], check=True, capture_output=True)  # fmt: skip
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, _docker("logs", name)
            time.sleep(0.5)
        answer = httpx.post(
            f"{url}/translator/translate", json=[{"src": sentence, "beam_size": 1}], timeout=60
        )
        assert answer.status_code == 200 and answer.json()[0][0]["tgt"] == printed.stdout.strip()
        subprocess.run(["docker", "stop", "-t", "35", name], check=True, capture_output=True)
        assert _docker("inspect", "-f", "{{.State.ExitCode}}", name).strip() == "0"
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
