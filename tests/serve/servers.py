"""``attnkit serve`` in a process of its own, for the tests that talk to it over real HTTP."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def generated(run, prompts: list[str], overrides: list[str], folder) -> list[str]:
    """What ``attnkit generate`` prints for ``prompts`` (prompt i seeded ``decode.seed + i``)."""
    import json

    (folder / "prompts.txt").write_text("\n".join(prompts) + "\n", encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "attnkit",
        "generate",
        "--ckpt",
        str(run),
        "-i",
        str(folder / "prompts.txt"),
    ]
    printed = subprocess.run(
        [*command, *overrides], capture_output=True, text=True, encoding="utf-8", check=True
    )
    return [json.loads(line)["text"] for line in printed.stdout.splitlines()]


def worker_processes(pid: int) -> list[int]:
    """The worker processes (multiprocessing's spawned children, not its resource tracker) that a
    server ``pid`` started and that still run."""
    from pathlib import Path

    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text(encoding="utf-8").rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        if int(fields[1]) == pid and fields[0] != "Z":  # its parent, and not a zombie
            command = (stat.parent / "cmdline").read_bytes()
            if b"spawn_main" in command:
                found.append(int(stat.parent.name))
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``attnkit serve`` in a process of its own, ready once /health says so. What it prints goes to a
    file (a pipe nobody reads would fill with the access log and stop the server)."""

    def __init__(self, run, *options, own_group: bool = False, steps: str | None = "eager"):
        """``own_group``: the server leads a process group of its own, as a command typed in a terminal
        does (a Ctrl-C there signals the whole group: ``os.killpg``). ``steps``: a translator's
        ``decode.steps`` unless an option sets it: the model's own steps, so that a test's answers do
        not change when compiled steps, built in the background (``auto``), come into the cache (None:
        no such option, for models that take none)."""
        if steps is not None and not any(option.startswith("decode.steps=") for option in options):
            options = (*options, f"decode.steps={steps}")
        self.url = f"http://127.0.0.1:{_free_port()}"
        port = self.url.rsplit(":", 1)[1]
        self.log = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115 (closed by the OS at exit)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "attnkit", "serve", "--ckpt", str(run), "--port", port, *options],
            stdout=self.log, stderr=subprocess.STDOUT, text=True, encoding="utf-8",
            start_new_session=own_group,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.output()
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError("the server did not get ready in 120 s")

    def post(self, body, **headers):
        return httpx.post(f"{self.url}/translator/translate", json=body, headers=headers, timeout=120)

    def output(self) -> str:
        """What the server has printed so far (read without moving the file's offset, which the server
        writes at: a seek here would have it write over its own log)."""
        size = os.fstat(self.log.fileno()).st_size
        return os.pread(self.log.fileno(), size, 0).decode("utf-8", errors="replace")

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        return code, self.output()
