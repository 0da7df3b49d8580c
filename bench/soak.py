"""The soak of ``bench/serve_load.py``: requests to a running ``attnkit serve`` from 8 clients, a fifth of
them hostile, and what the server made of them.

:func:`soak` sends ``n`` requests, each of one kind drawn at random: a good one (its answer checked
against the answer the server gave the same input alone), or one of the hostile kinds of ``HOSTILE``
(malformed bodies, bodies over the 1 MiB limit, ``/explore`` past its bounds and within them, random
paths, clients that give up before their answer), each with the statuses it may get. It counts server
errors (5xx but 503), wrong answers, unexpected statuses, the server's resident memory (with its engine
processes) after the first 1,000 requests and at the end, and whether one more request is answered at
once afterwards (no hang).

A dialect says how to speak to one kind of served model: :class:`Dialect` (a translator,
``/translator/translate``), :class:`GeneratorDialect` (a decoder, ``/generate``, its leaving clients
dropping streams), :class:`CaptionerDialect` (image uploads: decompression bombs, other formats, files
cut short, images of another size) and :class:`RecogniserDialect` (WAV uploads: absurd sample rates,
samples cut mid-way, clips too short, sound over the budget).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import random
import struct
import time
import wave
import zlib
from pathlib import Path
from typing import ClassVar

import httpx
import numpy as np

BIG_BODY = json.dumps([{"src": "x" * 1000}] * 2100).encode()  # 2.1 MB: over the 1 MiB body limit
LONG_TEXT = "ein Hund läuft über eine Wiese " * 34  # about 1,000 characters: over /explore's 64 tokens
JSON = {"content-type": "application/json"}
# what each kind of soak request expects: its share of the requests (a fifth in all)
SHARES = {"malformed": 0.08, "oversized": 0.02, "explore_long": 0.02, "explore": 0.02, "random_path": 0.03,
          "leave": 0.03}  # fmt: skip


class Dialect:
    """How the soak speaks to a translator: its good request and answer, its malformed bodies, the
    explorer past its bound and within it, and a client that leaves before its answer. ``statuses``:
    what each hostile kind may be answered (503 is always allowed: a full queue)."""

    endpoint = "/translator/translate"
    malformed = (b'[{"src": "ein Hund', b'[{"src": 12}]', b'[{"text": "ein Hund"}]', b"[]",
                 b'[{"src": "\\ud800"}]', "[{\"src\": \"\u00e9\"}]".encode("latin-1"))  # fmt: skip
    statuses: ClassVar[dict[str, set[int]]] = {
        "malformed": {400, 422}, "oversized": {413}, "explore_long": {413}, "explore": {200},
        "random_path": {404}, "leave": set(),
    }  # fmt: skip

    def body(self, text: str):
        return [{"src": text}]

    def answer(self, response: httpx.Response) -> str:
        return response.json()[0][0]["tgt"]

    async def good(self, http: httpx.AsyncClient, url: str, item) -> httpx.Response:
        return await http.post(url + self.endpoint, json=self.body(item))

    async def bad(self, http: httpx.AsyncClient, url: str, rng: random.Random) -> httpx.Response:
        return await http.post(url + self.endpoint, content=rng.choice(self.malformed), headers=JSON)

    async def oversized(self, http: httpx.AsyncClient, url: str) -> httpx.Response:
        return await http.post(url + self.endpoint, content=BIG_BODY, headers=JSON)

    async def explore(self, http: httpx.AsyncClient, url: str, item, long: bool) -> httpx.Response:
        return await http.get(f"{url}/explore", params={"text": LONG_TEXT if long else item})

    async def leave(self, http: httpx.AsyncClient, url: str, item) -> None:
        """A client that gives up 5 ms after sending (its request is dropped, or abandoned mid-batch)."""
        with contextlib.suppress(httpx.TimeoutException):
            await http.post(url + self.endpoint, json=self.body(item), timeout=0.005)


class GeneratorDialect(Dialect):
    endpoint = "/generate"
    malformed = (b'{"inputs": "the', b'{"inputs": 12}', b'{"parameters": {}}',
                 b'{"inputs": "a", "parameters": {"stop": [' + b'"x",' * 16 + b'"x"]}}',
                 b'{"inputs": "a", "parameters": {"seed": 18446744073709551616}}',
                 b'{"inputs": "a", "parameters": {"temperature": 1e308}}')  # fmt: skip

    def body(self, text: str):
        return {"inputs": text[:40], "parameters": {"max_new_tokens": 24, "seed": 7}}

    def answer(self, response: httpx.Response) -> str:
        return response.json()["generated_text"]

    async def leave(self, http: httpx.AsyncClient, url: str, item) -> None:
        """A streaming client that leaves after the first piece of text (its generation stops)."""
        body = {**self.body(item), "parameters": {"max_new_tokens": 200, "seed": 7}}
        async with http.stream("POST", url + "/generate_stream", json=body) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("data: "):
                    break


class UploadDialect(Dialect):
    """A model that reads uploaded files (``POST /predict``, ``POST /explore``): good files, hostile
    ones, forms that cannot be read, JSON where a form belongs."""

    endpoint = "/predict"
    field = output = mime = ""
    statuses: ClassVar[dict[str, set[int]]] = {
        "malformed": {400, 413, 415, 422}, "oversized": {413}, "explore_long": {413, 422}, "explore": {200},
        "random_path": {404}, "leave": set(),
    }  # fmt: skip

    def __init__(self, items: list[bytes], hostile: list[bytes], long: bytes) -> None:
        self.items, self.hostile, self.long = items, hostile, long

    def files(self, *data: bytes) -> list:
        return [(self.field, (f"upload{i}", d, self.mime)) for i, d in enumerate(data)]

    def answer(self, response: httpx.Response) -> str:
        return response.json()["outputs"][0][self.output]

    async def good(self, http: httpx.AsyncClient, url: str, item) -> httpx.Response:
        return await http.post(url + self.endpoint, files=self.files(item))

    async def bad(self, http: httpx.AsyncClient, url: str, rng: random.Random) -> httpx.Response:
        form = rng.random()
        if form < 0.1:  # a form without its boundary
            return await http.post(
                url + self.endpoint, content=b"--x\r\n", headers={"content-type": "multipart/form-data"}
            )
        if form < 0.15:  # more files than a form may hold
            return await http.post(url + self.endpoint, files=self.files(*[b"x"] * 257))
        if form < 0.2:  # JSON where the files belong
            return await http.post(url + self.endpoint, json={"inputs": ["a 3"]})
        return await http.post(url + self.endpoint, files=self.files(rng.choice(self.hostile)))

    async def oversized(self, http: httpx.AsyncClient, url: str) -> httpx.Response:
        return await http.post(url + self.endpoint, files=self.files(b"\0" * 1_100_000))

    async def explore(self, http: httpx.AsyncClient, url: str, item, long: bool) -> httpx.Response:
        return await http.post(f"{url}/explore", files=self.files(self.long if long else item))

    async def leave(self, http: httpx.AsyncClient, url: str, item) -> None:
        with contextlib.suppress(httpx.TimeoutException):
            await http.post(url + self.endpoint, files=self.files(item), timeout=0.005)


class CaptionerDialect(UploadDialect):
    field, output, mime = "image", "caption", "image/png"

    @classmethod
    def of(cls) -> CaptionerDialect:
        """The captioning task's scenes (48 × 48); bombs, another format, a file cut short, another size
        and no image at all as hostile files; a bomb for the explorer too."""
        from attnkit.data.digit_scenes import CANVAS, digit_scenes

        scenes = [_png(image) for image in digit_scenes("test", 50, seed=3).images.numpy()]
        tiff = io.BytesIO()
        _pil().fromarray(np.zeros((CANVAS, CANVAS), np.uint8)).save(tiff, "TIFF")
        hostile = [_bomb(8000), _bomb(30000, depth=1), tiff.getvalue(), scenes[0][:200],
                   _png(np.zeros((CANVAS // 2, CANVAS), np.uint8)), b"not an image"]  # fmt: skip
        return cls(scenes, hostile, _bomb(8000))


class RecogniserDialect(UploadDialect):
    field, output, mime = "audio", "transcript", "audio/wav"

    @classmethod
    def of(cls) -> RecogniserDialect:
        """Sounds of 1 to 3 s; absurd rates (a million 8-bit samples at 100 Hz, under 1 MiB: a million
        frames of features), samples cut mid-way, clips too short and no WAV at all as hostile files;
        20 s for the explorer (past its 64 annotations). (Sound over the batch budget cannot come in
        1 MiB at the recipes' 12 frames an annotation: 1 MiB of 8-bit sound at 8 kHz is 131 s, about
        1,100 annotations of the 4,096.)"""
        sounds = [_wav(_chirp(1 + (k % 5) / 2, k)) for k in range(50)]
        cut = sounds[0][:40] + (10**6).to_bytes(4, "little") + sounds[0][44:1001]
        slow = _wav(np.zeros(1_000_000), 100, width=1)
        hostile = [
            slow,
            _wav(_chirp(1, 1), 40),
            cut,
            _wav(_chirp(0.01, 2)),
            b"RIFF" + b"\0" * 60,
            b"not a sound",
        ]
        return cls(sounds, hostile, _wav(_chirp(20, 9)))


async def soak(url: str, n: int, items: list, pid: int, dialect: Dialect) -> dict:
    """``n`` requests from 8 clients, a fifth of them hostile (see the module docstring); server errors,
    wrong answers, unexpected statuses, RSS growth, and whether the server still answers at once
    afterwards."""
    rng = random.Random(0)
    async with httpx.AsyncClient(timeout=120) as http:
        alone, used = {}, items[:50]
        for item in used:  # each input's answer when it is alone
            alone[item] = dialect.answer(await dialect.good(http, url, item))
        kinds, shares = list(SHARES), list(SHARES.values())
        plan = [(rng.choices([*kinds, "good"], [*shares, 1 - sum(shares)])[0], used[k % len(used)])
                for k in range(n)]  # fmt: skip
        counts = {"5xx": 0, "503": 0, "wrong": 0, "unexpected": 0, **{kind: 0 for kind in [*kinds, "good"]}}
        rss, turn = {}, [0]

        async def one(kind: str, item) -> httpx.Response | None:
            if kind == "malformed":
                return await dialect.bad(http, url, rng)
            if kind == "oversized":
                return await dialect.oversized(http, url)
            if kind in ("explore", "explore_long"):
                return await dialect.explore(http, url, item, kind == "explore_long")
            if kind == "random_path":
                return await http.get(f"{url}/{rng.getrandbits(64):x}/{rng.getrandbits(32):x}")
            if kind == "leave":
                return await dialect.leave(http, url, item)
            return await dialect.good(http, url, item)

        async def client() -> None:
            while turn[0] < n:
                k = turn[0]
                turn[0] += 1
                kind, item = plan[k]
                response = await one(kind, item)
                counts[kind] += 1
                if response is not None:
                    if kind == "good" and response.status_code == 200:
                        counts["wrong"] += dialect.answer(response) != alone[item]
                    expected = dialect.statuses.get(kind, {200})
                    counts["unexpected"] += response.status_code not in expected | {503}
                    counts["503"] += response.status_code == 503
                    counts["5xx"] += response.status_code >= 500 and response.status_code != 503
                if k + 1 == 1000:
                    rss["first_1000"] = rss_mb(pid)

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(8)))
        seconds = time.perf_counter() - began
        rss["end"] = rss_mb(pid)
        after = time.perf_counter()  # no hang: one more request, answered at once
        last = await dialect.good(http, url, used[0])
        health = (await http.get(f"{url}/health", timeout=10)).json()["status"]
    answered_after = {
        "after_status": last.status_code,
        "after_ms": round((time.perf_counter() - after) * 1e3),
    }
    ratio = {"rss_ratio": round(rss["end"] / rss["first_1000"], 3)} if "first_1000" in rss else {}
    return {**counts, **rss, **ratio, **answered_after, "health": health, "seconds": round(seconds, 1)}


def rss_mb(pid: int) -> float:
    """The resident memory of process ``pid`` and of the processes it started (a server's engine
    processes), in MB."""
    total = 0.0
    for process in [pid, *_children(pid)]:
        with contextlib.suppress(OSError):  # (one that ended meanwhile)
            for line in Path(f"/proc/{process}/status").read_text(encoding="ascii").splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1e3
    return total


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(stat.read_text(encoding="utf-8").rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _pil():
    from PIL import Image

    return Image


def _png(pixels: np.ndarray) -> bytes:
    written = io.BytesIO()
    _pil().fromarray(pixels.astype(np.uint8)).save(written, "PNG")
    return written.getvalue()


def _bomb(side: int, depth: int = 8) -> bytes:
    """A PNG whose header declares a ``side × side`` grey image of zeros, compressed to almost nothing."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"\0" * ((side * depth + 7) // 8 + 1) * side
    header = struct.pack(">IIBBBBB", side, side, depth, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )


def _chirp(seconds: float, seed: int, rate: int = 16000) -> np.ndarray:
    """A tone sweeping up and down in pitch, with some noise."""
    t = np.arange(int(seconds * rate)) / rate
    pitch = 300 + 2500 * np.abs(np.sin(np.pi * t / seconds))
    noise = np.random.default_rng(seed).normal(0, 0.05, len(t))
    return 0.5 * np.sin(2 * np.pi * np.cumsum(pitch) / rate) + noise


def _wav(samples: np.ndarray, rate: int = 16000, width: int = 2) -> bytes:
    """``samples`` in [-1, 1] as a mono WAV file of ``width``-byte samples."""
    written = io.BytesIO()
    with wave.open(written, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(width)
        out.setframerate(rate)
        x = np.clip(samples, -1, 1)
        out.writeframes(
            (x * 127 + 128).astype(np.uint8).tobytes() if width == 1 else (x * 32767).astype("<i2").tobytes()
        )
    return written.getvalue()
