"""A checkpoint's draft decoder (models/draft.py: a translation model's or a GPT's):
``draft.safetensors`` beside ``model.safetensors``.

``attnkit distill-draft`` adds it to a checkpoint folder that is already complete, so it is written
the way every attnkit file is (atomic.py): under a hidden name, fsync'ed, then renamed into place,
so that a run killed while writing leaves the checkpoint as it was. What made it (the sentences it
learnt from, how long, how often it agreed with the model) is kept in the file's metadata.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from attnkit.atomic import atomic_path
from attnkit.checkpoint.files import read_safetensors
from attnkit.errors import AttnkitError
from attnkit.models.draft import DRAFT_FILE, ShallowCausalDraft, ShallowDraft, draft_for


def write_draft(checkpoint: Path, draft: ShallowDraft | ShallowCausalDraft, about: dict[str, str]) -> Path:
    """Save ``draft``'s weights (its one layer's) into ``checkpoint``, replacing any draft there;
    ``about``: what made it, kept as the file's metadata."""
    path = checkpoint / DRAFT_FILE
    weights = {name: tensor.detach().contiguous().cpu() for name, tensor in draft.state_dict().items()}
    with atomic_path(path) as temporary:
        save_file(weights, str(temporary), metadata={"format": "pt", **about})
    return path


def draft_about(checkpoint: Path) -> dict[str, str]:
    """What made ``checkpoint``'s draft (its file's metadata); empty where it has none."""
    path = checkpoint / DRAFT_FILE
    if not path.is_file():
        return {}
    with safe_open(str(path), "pt") as f:
        return dict(f.metadata() or {})


def attach_draft(model: nn.Module, checkpoint: Path) -> ShallowDraft | ShallowCausalDraft:
    """``model.draft``: the draft decoder saved in ``checkpoint``; a one-line error where there is none
    (naming the command that makes one) or it does not fit the model."""
    path = checkpoint / DRAFT_FILE
    if not path.is_file():
        raise AttnkitError(
            f"{checkpoint} has no draft decoder ({DRAFT_FILE}) for decode.speculative=shallow; make one "
            f"with: attnkit distill-draft --ckpt {checkpoint}"
        )
    draft = draft_for(model)
    weights = read_safetensors(path)
    expected = draft.state_dict()
    if set(weights) != set(expected) or any(weights[n].shape != expected[n].shape for n in expected):
        raise AttnkitError(f"{path}: a draft decoder of another shape than this checkpoint's model")
    draft.load_state_dict(weights)
    model.draft = draft
    return draft
