"""A checkpoint's files read with one-line errors naming the file: missing, unreadable or corrupt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from attnkit.errors import AttnkitError


def read_json(path: Path) -> Any:
    """The JSON value in ``path``, a file of a checkpoint."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AttnkitError(f"{path}: missing from the checkpoint") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AttnkitError(f"{path}: not readable JSON ({error})") from None


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors in ``path``, a safetensors file of a checkpoint (nothing is unpickled)."""
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise AttnkitError(f"{path}: missing from the checkpoint") from None
    except (SafetensorError, OSError) as error:
        raise AttnkitError(f"{path}: corrupt or truncated ({error})") from None
