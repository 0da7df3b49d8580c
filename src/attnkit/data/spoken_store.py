"""Synthesised utterances kept as features, so that a run that resumes, a second run of the same
settings, ``attnkit evaluate`` and the tour do not synthesise them again (a minute for 8,000).

One safetensors file a set, under ``data.store`` (as the token stores: ``$XDG_CACHE_HOME/attnkit/stores``
by default) in ``spoken/``, named by a hash of everything that makes the set: its split, size, seed, the
features' bands, the espeak-ng version and :data:`FORMAT`. The features of every utterance are one
``(frames, n_mels)`` float32 tensor with each utterance's length beside it; the texts and voices are its
metadata. It is written to a temporary file of its own, created exclusively (a name planted in a shared
store folder, a link among them, is never written through), and renamed (a crash leaves no half
file); a file that does not read back is made again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from torch import Tensor

from attnkit.atomic import make_shareable
from attnkit.data.spoken import require_espeak
from attnkit.data.store import store_root, writable_root

FORMAT = 1  # bumped whenever what is stored changes


def espeak_version() -> str:
    """What ``espeak-ng --version`` says (a new version speaks differently)."""
    return subprocess.run(
        [require_espeak(), "--version"], capture_output=True, text=True, encoding="utf-8", check=True
    ).stdout.strip()


def spoken_path(store: str, settings: dict) -> Path:
    """Where the set made with ``settings`` is kept."""
    identity = json.dumps({**settings, "espeak": espeak_version(), "format": FORMAT}, sort_keys=True)
    key = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:24]
    return store_root(store) / "spoken" / f"{key}.safetensors"


def kept_or_made(
    store: str, settings: dict, make: Callable[[], tuple[list[Tensor], list[str], list[str]]]
) -> tuple[list[Tensor], list[str], list[str]]:
    """The features, texts and voices of the set ``settings`` describes: read from the store, or
    ``make()`` and kept there."""
    path = spoken_path(store, settings)
    try:
        tensors, metadata = load_file(path), _metadata(path)
        lengths = tensors["lengths"].tolist()
        features = list(torch.split(tensors["features"], lengths))
        return features, json.loads(metadata["texts"]), json.loads(metadata["voices"])
    except (OSError, SafetensorError, KeyError, ValueError, RuntimeError):
        pass  # not there yet, or not whole: made again
    features, texts, voices = make()
    tensors = {"features": torch.cat(features), "lengths": torch.tensor([len(f) for f in features])}
    data = save(tensors, metadata={"texts": json.dumps(texts), "voices": json.dumps(voices)})
    # a name of its own, created exclusively (never a file or link someone planted in a shared store)
    handle, work = tempfile.mkstemp(dir=writable_root(path.parent), prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        make_shareable(Path(work))
        os.replace(work, path)
    except BaseException:
        Path(work).unlink(missing_ok=True)
        raise
    return features, texts, voices


def _metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(path, "pt") as opened:
        return opened.metadata() or {}
