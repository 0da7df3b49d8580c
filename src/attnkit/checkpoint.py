"""Checkpoints: safetensors + JSON, written atomically, self-contained, resumable.

A run directory holds one folder per checkpoint, ``step-0000500/``, each with everything a later command
needs: ``config.json``, ``model.safetensors``, ``tokenizer.json`` (not for image models, which read
pixels), and for resuming
``trainer_state.safetensors`` (optimizer tensors, every process's RNG states) + ``trainer_state.json``
(step, epoch, position in the epoch, best score, scalar optimizer settings). ``last`` and ``best`` are
small text files naming a checkpoint folder.

Why atomic: none of the usual tools (nanoGPT, JoeyNMT, HF) is, and a run killed while saving then
leaves a torn file that breaks resuming. Here a checkpoint folder is written whole or not at all
(folders.py, which also records in ``made_by.json`` what made it), and only then are the
``last``/``best`` pointers replaced (also by rename). A kill at any moment leaves a complete checkpoint
and pointers naming complete folders. Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # Windows: no flock; runs are not locked there
    fcntl = None

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file, save_model

from attnkit.atomic import open_own, write_text_atomic
from attnkit.config import RunConfig, with_decode_overrides
from attnkit.cpu import quantize_int8, speed_up
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import AttnkitError, ConfigError
from attnkit.folders import MadeBy, recover, write_folder
from attnkit.models import ARCHITECTURES, TransformerConfig, build_model, load_weights
from attnkit.sharded import SHARDED, holds_shards, read_whole, shard_like

CHECKPOINT_PREFIX = "step-"
RUN_FILES = ("last", "best", "metrics.csv", "averaged")  # besides the step-* folders
LOCK_FILE = ".lock"  # held by the process training in the run directory (lock_run)


# --- trainer state: optimizer and random number generators -----------------------------------------


def rng_state() -> dict[str, Any]:
    """This process's random number generator states (torch CPU, its CUDA device, Python's ``random``)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def _optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The optimizer's state split into tensors (for safetensors) and plain values (for JSON)."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, per_param in state["state"].items():
        for key, value in per_param.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{index}.{key}"] = value.contiguous()
            else:
                scalars[f"{index}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The optimizer's state tensors by name (``optimizer.{index}.{key}``), as a checkpoint holds them."""
    return _optimizer_state(optimizer)[0]


def _parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters in the order its state numbers them (``optimizer.{index}.{key}``)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def _parameter_of(optimizer: torch.optim.Optimizer) -> Callable[[str], torch.Tensor | None] | None:
    """For a sharded optimizer (FSDP), what tells the parameter that a state tensor's name
    (``optimizer.{index}.{key}``) belongs to; None for one that holds whole parameters."""
    parameters = _parameters(optimizer)
    if not any(hasattr(p, "device_mesh") for p in parameters):
        return None
    return lambda name: parameters[int(name.split(".")[1])]


def _load_optimizer_state(optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Load the optimizer's state from whole tensors (a sharded optimizer takes its slices of them)."""
    parameters = _parameters(optimizer)
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = shard_like(value, parameters[int(index)])
    for name, value in meta["scalars"].items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def _trainer_state_files(
    folder: Path, optimizer: torch.optim.Optimizer, trainer_state: dict[str, Any], rng: list[dict[str, Any]]
) -> None:
    """``trainer_state.safetensors`` (optimizer tensors, RNG tensors of every rank) and ``.json``; in a
    sharded checkpoint the optimizer's tensors are in its shards already."""
    tensors, optimizer_meta = _optimizer_state(optimizer)
    if holds_shards(folder):
        tensors = {}
    for rank, state in enumerate(rng):
        tensors[f"rng.{rank}.torch"] = state["torch"]
        if "cuda" in state:
            tensors[f"rng.{rank}.cuda"] = state["cuda"]
    save_file(tensors, str(folder / "trainer_state.safetensors"))
    python_rng = [[s["python"][0], list(s["python"][1]), s["python"][2]] for s in rng]
    meta = {**trainer_state, "optimizer": optimizer_meta, "world_size": len(rng), "python_rng": python_rng}
    (folder / "trainer_state.json").write_text(json.dumps(meta), encoding="utf-8")


# --- saving ---------------------------------------------------------------------------------------


def checkpoint_folder(run_dir: Path, step: int) -> Path:
    """Where step ``step``'s checkpoint goes: ``run_dir/step-0000500``."""
    return run_dir / f"{CHECKPOINT_PREFIX}{step:07d}"


def save_checkpoint(
    run_dir: Path,
    step: int,
    *,
    model: torch.nn.Module,
    config: dict[str, Any],
    tokenizer_json: str | None,
    optimizer: torch.optim.Optimizer | None = None,
    trainer_state: dict[str, Any] | None = None,
    rng: list[dict[str, Any]] | None = None,
    is_best: bool = False,
    keep_last: int = 5,
    command: str = "attnkit train",
    source: str | Path | None = None,
    temporary: Path | None = None,
) -> Path:
    """Write ``run_dir/step-{step}`` atomically, move the pointers, and prune old checkpoints.

    With ``optimizer`` and ``trainer_state`` the checkpoint can be resumed; ``rng`` holds every
    process's :func:`rng_state` (rank order), default this process's only. ``command`` and ``source``
    (default: the run directory) are recorded as what made the folder. A step folder already there is
    replaced: whoever saves into ``run_dir`` holds it (the trainer: :func:`lock_run`, and it refuses a
    directory holding another run), so a step folder there is this run's own.

    ``temporary``: the folder (:func:`folders.new_temporary`) where every process has written its
    shards of the model and the optimizer (``train.parallel=fsdp``, :mod:`attnkit.sharded`).
    """

    def write(folder: Path) -> None:
        if not holds_shards(folder):
            save_model(model, str(folder / "model.safetensors"))  # handles the tied embeddings
        (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        if tokenizer_json is not None:  # image models have no tokenizer
            (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        if optimizer is not None and trainer_state is not None:
            _trainer_state_files(folder, optimizer, trainer_state, rng or [rng_state()])

    maker = MadeBy.of(command, run_dir if source is None else source)
    final = write_folder(checkpoint_folder(run_dir, step), write, maker, overwrite=True, temporary=temporary)
    write_text_atomic(run_dir / "last", final.name)
    if is_best:
        write_text_atomic(run_dir / "best", final.name)
    _prune(run_dir, keep_last)
    return final


def holds_weights(folder: Path) -> bool:
    """Whether ``folder`` is a checkpoint: one file of weights, or the shards of an FSDP run."""
    return (folder / "model.safetensors").is_file() or holds_shards(folder)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders of a run, oldest first."""
    if not run_dir.is_dir():
        return []
    for aside in run_dir.glob(f".{CHECKPOINT_PREFIX}*.replaced"):
        recover(run_dir / aside.name[1 : -len(".replaced")])
    return sorted(p for p in run_dir.glob(f"{CHECKPOINT_PREFIX}*") if holds_weights(p))


def _prune(run_dir: Path, keep_last: int) -> None:
    keep = {
        (run_dir / name).read_text(encoding="utf-8").strip()
        for name in ("last", "best")
        if (run_dir / name).is_file()
    }
    checkpoints = list_checkpoints(run_dir)
    for old in checkpoints[: max(len(checkpoints) - keep_last, 0)]:
        if old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)


# --- one training process per run directory ---------------------------------------------------------


def lock_run(run_dir: Path) -> IO[str] | None:
    """Hold ``run_dir`` for this process until the returned file is closed or the process ends (even
    killed: the system lets go of the lock). A second ``attnkit train`` on the same directory then stops
    with one line instead of writing the same run twice (a second ``--resume``) or deleting the first
    one's checkpoints under it (``--overwrite``). None where the system has no ``flock`` (Windows)."""
    if fcntl is None:
        return None
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open_own(run_dir / LOCK_FILE, "r+", encoding="utf-8")  # held for the run
    except OSError as error:
        raise AttnkitError(f"{run_dir}: cannot write checkpoints there ({error.strerror or error})") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # held; any other error is a file system without locks (some NFS): go on
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise AttnkitError(
            f"{run_dir} is in use by {holder}: wait for it to end, or choose another run directory"
        ) from None
    except OSError:
        return handle
    handle.truncate(0)
    handle.write(f"attnkit train (process {os.getpid()})")
    handle.flush()
    return handle


# --- an earlier run in the same directory ---------------------------------------------------------


def earlier_run(run_dir: Path) -> list[Path]:
    """What an earlier run left in ``run_dir``: checkpoint folders (half-written ones too), the pointers,
    the metrics log and the default average. Other files (a recipe kept there, say) do not count."""
    if not run_dir.is_dir():
        return []
    hidden = tuple(f".{name}" for name in (CHECKPOINT_PREFIX, *RUN_FILES))
    return sorted(
        p
        for p in run_dir.iterdir()
        if p.name in RUN_FILES or p.name.startswith((CHECKPOINT_PREFIX, *hidden, "metrics.csv"))
    )


def clear_run(run_dir: Path) -> None:
    """Delete what :func:`earlier_run` finds, pointers first (so none ever names a deleted folder)."""
    for path in sorted(earlier_run(run_dir), key=lambda p: p.name not in ("last", "best")):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


# --- the other model folder attnkit writes: a CTranslate2 export ---------------------------------------

DECODE_FILE = "attnkit_decode.json"  # a CTranslate2 folder's decoding settings (the run's decode section)
MODEL_FILE = "attnkit_model.json"  # and what it holds: {"arch": the model's, "context": its positions}


def ctranslate2_command(folder: Path, arch: str) -> str:
    """The attnkit command that runs ``folder``, a CTranslate2 folder of an ``arch`` model (its main
    command, as the architecture's record says)."""
    return f"attnkit {ARCHITECTURES[arch].commands[0]} --engine ctranslate2 --ckpt {folder}"


def exported_model(folder: Path) -> dict:
    """What a CTranslate2 folder from ``attnkit export --to ctranslate2`` holds (``MODEL_FILE``): ``arch``
    and, for a decoder, ``context``. Folders exported before that file existed held translation models."""
    held = folder / MODEL_FILE
    return (
        json.loads(held.read_text(encoding="utf-8")) if held.is_file() else {"arch": TransformerConfig.ARCH}
    )


# --- loading --------------------------------------------------------------------------------------


def resolve_checkpoint(path: str | Path, prefer: str = "best") -> Path:
    """A checkpoint folder: ``path`` itself, or the one a run directory's ``best``/``last`` names."""
    path = Path(path)
    recover(path)
    if holds_weights(path):
        return path
    for pointer in (prefer, "last", "best"):
        if (path / pointer).is_file():
            target = path / (path / pointer).read_text(encoding="utf-8").strip()
            recover(target)
            if holds_weights(target):
                return target
    if (path / "last").is_file():
        raise AttnkitError(
            f"{path}: 'last' names {(path / 'last').read_text(encoding='utf-8').strip()!r}, which is gone"
        )
    if (path / "model.bin").is_file():  # what `attnkit export --to ctranslate2` writes
        arch = exported_model(path)["arch"]
        command = ARCHITECTURES[arch].commands[0]
        raise AttnkitError(
            f"{path}: a CTranslate2 model folder, not an attnkit checkpoint; {command} with it by "
            f"{ctranslate2_command(path, arch)}"
        )
    raise AttnkitError(
        f"{path}: no checkpoint here (expected model.safetensors, or a run directory with 'last')"
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AttnkitError(f"{path}: missing from the checkpoint") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AttnkitError(f"{path}: not readable JSON ({error})") from None


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise AttnkitError(f"{path}: missing from the checkpoint") from None
    except (SafetensorError, OSError) as error:
        raise AttnkitError(f"{path}: corrupt or truncated ({error})") from None


def read_run_config(checkpoint: Path) -> RunConfig:
    """The run configuration a checkpoint was trained with."""
    values = _read_json(checkpoint / "config.json")
    if not isinstance(values, dict):
        raise ConfigError(f"{checkpoint / 'config.json'}: not a run configuration")
    if "model_type" in values:  # an HF transformers folder (`attnkit export --to hf`, save_pretrained)
        raise AttnkitError(
            f"{checkpoint}: an HF transformers model folder (model_type {values['model_type']!r}), not an "
            f"attnkit checkpoint; make it one with attnkit import-hf {checkpoint} --out RUN_DIR"
        )
    return RunConfig.from_dict(values, str(checkpoint / "config.json"))


def read_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model's weights in ``checkpoint``, whole: ``model.safetensors``, or put together from the
    shards of an FSDP run."""
    if holds_shards(checkpoint):
        return read_whole(checkpoint, "model")
    return _read_safetensors(checkpoint / "model.safetensors")


def load_model_weights(model: torch.nn.Module, checkpoint: Path) -> None:
    """Load the checkpoint's weights into ``model`` (re-tying shared weights)."""
    path = checkpoint / (f"{SHARDED}/model" if holds_shards(checkpoint) else "model.safetensors")
    weights = read_weights(checkpoint)
    expected = model.state_dict()
    for name, tensor in weights.items():
        if name in expected and expected[name].shape != tensor.shape:
            raise AttnkitError(
                f"{path}: '{name}' has shape {tuple(tensor.shape)} but config.json and tokenizer.json "
                f"describe {tuple(expected[name].shape)} (are the files from different checkpoints?)"
            )
    missing, unexpected = load_weights(model, weights)  # the weights already read, not the file again
    if missing or unexpected:
        raise AttnkitError(
            f"{path}: weights do not fit the config (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )


def load_trainer_state(checkpoint: Path, optimizer: torch.optim.Optimizer, rank: int = 0) -> dict[str, Any]:
    """Restore the optimizer and this rank's RNG states; return the trainer's JSON state (step, epoch,
    position, ..., and ``world_size``, the number of processes that saved it)."""
    tensors = _read_safetensors(checkpoint / "trainer_state.safetensors")
    if holds_shards(checkpoint):  # a sharded optimizer reads only its own slices
        tensors.update(read_whole(checkpoint, "optimizer", _parameter_of(optimizer)))
    meta = _read_json(checkpoint / "trainer_state.json")
    try:
        _load_optimizer_state(optimizer, tensors, meta.pop("optimizer"))
        python_rng = meta.pop("python_rng")
        if rank < meta["world_size"]:
            state = {"torch": tensors[f"rng.{rank}.torch"], "python": python_rng[rank]}
            if f"rng.{rank}.cuda" in tensors:
                state["cuda"] = tensors[f"rng.{rank}.cuda"]
            _set_rng_state(state)
    except (KeyError, ValueError, TypeError, IndexError) as error:
        raise AttnkitError(
            f"{checkpoint}: trainer state does not fit this model and optimizer ({error})"
        ) from None
    return meta


def build_for_tokenizer(config: RunConfig, tokenizer: Tokenizer | None) -> torch.nn.Module:
    """The model of ``config`` for ``tokenizer``: its vocabulary size, and its ``<pad>`` as the model's
    padding id (``config.model.pad_id`` is set from the tokenizer, the one source of truth); an image
    model has no tokenizer (``None``)."""
    if tokenizer is None:
        return build_model(config.model, None)
    config.model.pad_id = tokenizer.specials.pad
    return build_model(config.model, tokenizer.vocab_size)


def read_tokenizer(checkpoint: Path, config: RunConfig) -> Tokenizer | None:
    """The checkpoint's tokenizer; ``None`` for an image model, which has none."""
    reads_images = ARCHITECTURES[config.model.arch].reads == "images"
    return None if reads_images else Tokenizer.load(checkpoint / "tokenizer.json")


def commands_for(arch: str) -> str:
    """The commands that use a trained ``arch`` model: ``"attnkit translate / evaluate"``."""
    return "attnkit " + " / ".join(ARCHITECTURES[arch].commands)


def a_model(arch: str) -> str:
    """``"an encoder-decoder model"``, ``"a decoder model"``, ``"an rnn model"``: an architecture's name
    in a sentence."""
    return f"{'an' if arch[0] in 'aeiour' else 'a'} {arch} model"  # 'r': "an rnn", read ar-en-en


def load_for_inference(
    path: str | Path,
    device: torch.device | str = "cpu",
    prefer: str = "best",
    arch: str | tuple[str, ...] | None = None,
    pack: bool = True,
    *,
    int8: bool = False,
    overrides: Sequence[str] = (),
):
    """``(model, tokenizer, run config)`` from a checkpoint folder or run directory, in eval mode, with
    the CPU fast path applied on a CPU (``attnkit.cpu.speed_up``): what every command and the server
    load a model to work with. With ``arch``, a checkpoint of another architecture is an error that says
    which command fits it. ``pack``: on a CPU, also keep the linear layers' weights in oneDNN's layout
    for faster inference (one more copy of them in memory); ``int8``: instead, the linear maps multiply
    int8 weights and inputs (``--int8``, CPU only). ``overrides`` (``decode.field=value``) change the
    run's decoding settings, checked before the model is built."""
    device = torch.device(device)
    if int8 and device.type != "cpu":
        raise AttnkitError(f"--int8 is for CPUs; this would decode on {device.type}")
    checkpoint = resolve_checkpoint(path, prefer)
    config = read_run_config(checkpoint)
    if arch is not None and config.model.arch not in ((arch,) if isinstance(arch, str) else arch):
        raise AttnkitError(
            f"{checkpoint} holds {a_model(config.model.arch)}, which this command cannot use; "
            f"use {commands_for(config.model.arch)}"
        )
    config.decode = with_decode_overrides(config.decode, list(overrides))
    tokenizer = read_tokenizer(checkpoint, config)
    if tokenizer is not None and config.model.pad_id != tokenizer.specials.pad:
        raise AttnkitError(
            f"{checkpoint}: config.json has model.pad_id={config.model.pad_id} but tokenizer.json's <pad> "
            f"is {tokenizer.specials.pad} (are the files from different checkpoints?)"
        )
    model = build_for_tokenizer(config, tokenizer)
    load_model_weights(model, checkpoint)
    model = model.to(device).eval()
    speed_up(model, inference=pack and not int8)
    if int8:
        quantize_int8(model)
    return model, tokenizer, config


def check_head(checkpoint: Path, config: RunConfig, heads: tuple[str, ...]) -> None:
    """A one-line error unless the encoder in ``checkpoint`` has one of ``heads`` (naming what it has)."""
    if config.model.head not in heads:
        what = {"mlm": "a masked-LM model (attnkit predict fills its masks; to fine-tune: train.init_from)",
                "none": "an encoder without a head"}.get(config.model.head, config.model.head)  # fmt: skip
        raise AttnkitError(f"{checkpoint} holds {what}; this needs a {' or '.join(heads)} head")


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
