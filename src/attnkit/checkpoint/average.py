"""Checkpoint averaging: the element-wise mean of several checkpoints' weights (Vaswani et al. §6.1
averaged the last 5 or 20), written as a checkpoint folder of its own."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from attnkit.checkpoint.folder import read_weights
from attnkit.errors import AttnkitError
from attnkit.folders import MadeBy, write_folder


def average_checkpoints(
    checkpoints: list[Path], out: Path, *, maker: MadeBy | None = None, overwrite: bool = False
) -> Path:
    """Write the element-wise mean of the checkpoints' weights (Vaswani et al. §6.1 averaged the last
    5 or 20) as a new checkpoint folder with the first one's config and tokenizer; written atomically,
    ``maker`` recorded as what made it (default: ``attnkit average`` of the first one's run directory;
    folders.py says what it replaces, with or without ``overwrite``)."""
    if not checkpoints:
        raise AttnkitError("no checkpoints to average")
    maker = maker or MadeBy.of("attnkit average", checkpoints[0].parent)
    refuse_to_replace_a_source(out, checkpoints)
    total: dict[str, torch.Tensor] = {}
    for path in checkpoints:
        weights = read_weights(path)
        if total and weights.keys() != total.keys():
            raise AttnkitError(f"{path}: its weights do not match {checkpoints[0]}'s; cannot average")
        for name, tensor in weights.items():
            if name in total and total[name].shape != tensor.shape:
                raise AttnkitError(
                    f"{path}: '{name}' has shape {tuple(tensor.shape)}, {checkpoints[0]}'s has "
                    f"{tuple(total[name].shape)}; cannot average"
                )
            total[name] = total.get(name, 0) + tensor.double()
    averaged = {name: (tensor / len(checkpoints)).float().contiguous() for name, tensor in total.items()}

    def write(folder: Path) -> None:
        save_file(averaged, str(folder / "model.safetensors"))
        for name in ("config.json", "tokenizer.json"):
            if (checkpoints[0] / name).exists():  # image models have no tokenizer.json
                shutil.copyfile(checkpoints[0] / name, folder / name)

    return write_folder(out, write, maker, overwrite=overwrite)


def refuse_to_replace_a_source(out: Path, sources: list[Path]) -> None:
    """Whatever ``--overwrite`` says, an output never replaces what it is made from: ``out`` must not be
    one of ``sources`` or a folder that holds one (their run directory)."""
    target = out.resolve()
    for source in sources:
        resolved = source.resolve()
        if resolved == target or target in resolved.parents:
            held = "is" if resolved == target else f"holds {source.name}, which is"
            raise AttnkitError(f"{out} {held} a checkpoint it would be made from; name another folder")
