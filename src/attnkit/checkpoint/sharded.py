"""Sharded checkpoints: what ``train.parallel=fsdp`` saves, one file per process, read back whole.

Under FSDP2 no process holds the whole model, and gathering it into one file would put the whole model
and the optimizer's state (twice its size) into one process at every save. So every process writes its
own slices through ``torch.distributed.checkpoint`` (DCP), in safetensors files whose headers record
where each slice lies (DCP's ``HuggingFaceStorageWriter``). Nothing is pickled: DCP's default format
keeps its index in a pickle, which a checkpoint shared between people must never need.

A sharded checkpoint folder holds ``sharded/model/`` and ``sharded/optimizer/`` (and ``sharded/files.json``,
the files and their sizes, to tell a complete folder from one that lost a file) in place of
``model.safetensors`` and the optimizer tensors of ``trainer_state.safetensors``; the rest (config,
tokenizer, ``trainer_state.json``, every process's random states) is as in any checkpoint.

:func:`read_whole` puts the slices back together in one process (DCP's loader without a process group),
so translate, average, export and a resume with any number of processes or with DDP read it like a
one-file checkpoint.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError

from attnkit.checkpoint.optimizer import optimizer_tensors
from attnkit.errors import AttnkitError
from attnkit.folders import new_temporary
from attnkit.processes import World

# torch.distributed.checkpoint is imported where it is used: it costs 0.6 s, which every command that
# loads a one-file checkpoint would pay

SHARDED = "sharded"  # the folder inside a checkpoint
PARTS = ("model", "optimizer")
FILES = "files.json"  # {part/file: size in bytes}, written once every process has written its files


def holds_shards(folder: Path) -> bool:
    """Whether ``folder`` is a sharded checkpoint (``train.parallel=fsdp``)."""
    return (folder / SHARDED / FILES).is_file()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's slice of a sharded tensor (DTensor); a plain tensor as it is."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def without_ties(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with each tensor under its first name only: the paper's shared embeddings appear
    under three names, which safetensors refuses to write three times (loading re-ties them)."""
    seen: set[int] = set()
    kept = {}
    for name, tensor in state.items():
        where = _local(tensor).data_ptr()
        if where not in seen or _local(tensor).numel() == 0:
            seen.add(where)
            kept[name] = tensor
    return kept


def write_sharded(
    final: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, world: World
) -> Path:
    """Every process writes its shards of ``model`` and ``optimizer`` into a new temporary folder of the
    first process, which is to become checkpoint folder ``final`` (it must be on a file system that all
    machines share); returns that folder (``folder.save_checkpoint`` then completes it). Collective: every
    process calls it."""
    temporary = Path(world.all_gather(str(new_temporary(final)) if world.is_main else "")[0])
    write_shards(
        temporary, {"model": without_ties(model.state_dict()), "optimizer": optimizer_tensors(optimizer)}
    )
    world.barrier()
    if world.is_main:
        seal(temporary)
    return temporary


def write_shards(folder: Path, parts: dict[str, dict[str, torch.Tensor]]) -> None:
    """Every process writes its slices of ``parts`` (``{"model": state, "optimizer": tensors}``,
    DTensors and plain tensors, plain ones written once) into ``folder/sharded``. Collective: every
    process calls it with the same ``folder``; :func:`seal` then records the files."""
    import torch.distributed.checkpoint as dcp

    for part, tensors in parts.items():
        writer = dcp.HuggingFaceStorageWriter(str(folder / SHARDED / part), save_distributed=True)
        dcp.save(tensors, storage_writer=writer)


def seal(folder: Path) -> None:
    """Record the shard files and their sizes (one process, after all have written)."""
    files = {
        str(path.relative_to(folder / SHARDED)): path.stat().st_size
        for part in PARTS
        for path in sorted((folder / SHARDED / part).glob("*.safetensors"))
    }
    (folder / SHARDED / FILES).write_text(json.dumps(files, indent=1), encoding="utf-8")


def _check_files(folder: Path) -> None:
    """A shard file missing or cut short is an error naming it (DCP would read what is left). The list
    is the checkpoint's own: an entry that is no ``PART/NAME.safetensors`` inside it (``../..``, an
    absolute path) is refused before any file is looked at, so that a planted ``files.json`` cannot
    probe the rest of the machine."""
    listed = folder / SHARDED / FILES
    try:
        files = json.loads(listed.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AttnkitError(f"{listed}: not readable ({error})") from None
    if not isinstance(files, dict):
        raise AttnkitError(f"{listed}: not the checkpoint's list of shard files ({{PART/NAME: bytes}})")
    for name, size in files.items():
        part, _, file = name.partition("/")
        if part not in PARTS or not file.endswith(".safetensors") or "/" in file or file.startswith("."):
            raise AttnkitError(
                f"{listed}: {name!r} is not a shard file of the checkpoint (PART/NAME.safetensors)"
            )
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise AttnkitError(f"{listed}: {name!r} has no size in bytes ({size!r})")
        path = folder / SHARDED / name
        if not path.is_file() or path.stat().st_size != size:
            found = f"{path.stat().st_size} bytes" if path.is_file() else "missing"
            raise AttnkitError(f"{path}: {found}, but the checkpoint was saved with {size} bytes there")


def _saved(where: str) -> dict:
    """The tensors a shard folder holds (name -> DCP's metadata: size, dtype, chunks), each checked
    to be whole: every element written by some process."""
    import torch.distributed.checkpoint as dcp

    saved = dcp.HuggingFaceStorageReader(where).read_metadata().state_dict_metadata
    for name, meta in saved.items():
        covered = sum(math.prod(chunk.sizes) for chunk in meta.chunks)
        if covered != math.prod(meta.size):
            raise AttnkitError(f"{where}: '{name}' is incomplete ({covered} of {math.prod(meta.size)})")
    return saved


def read_whole(folder: Path, part: str, like: Callable[[str], torch.Tensor | None] | None = None) -> dict:
    """The tensors of ``part`` ("model" or "optimizer") of sharded checkpoint ``folder``.

    Without ``like``: whole tensors, put together from every process's slices in this process alone.
    With ``like``: ``like(name)`` is the sharded parameter (a DTensor) that tensor ``name`` is held
    like, or None; each process then reads only its own slices of those, as DTensors (collective:
    every process calls it), and the other tensors whole."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    _check_files(folder)
    where = str(folder / SHARDED / part)
    try:
        tensors = {}
        for name, meta in _saved(where).items():
            parameter = like(name) if like else None
            sliced = parameter is not None and tuple(parameter.shape) == tuple(meta.size)
            tensors[name] = (
                torch.empty_like(parameter) if sliced else torch.empty(meta.size, dtype=meta.properties.dtype)
            )
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(tensors, storage_reader=dcp.HuggingFaceStorageReader(where), no_dist=like is None)
    except (SafetensorError, OSError, KeyError, ValueError, RuntimeError, CheckpointException) as error:
        raise AttnkitError(f"{where}: corrupt sharded checkpoint ({error})") from None
    return tensors
