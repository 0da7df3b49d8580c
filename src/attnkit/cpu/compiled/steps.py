"""The compiled step of a model: built or loaded from the cache the first time a search asks for it,
then kept for the process (each model's, by beam width and loops, until its weights change)."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from attnkit.cpu.compiled.build import build, compilable, missing_compiler, traced
from attnkit.cpu.compiled.cache import build_once, cache_folder, cache_key, prune_cache
from attnkit.cpu.compiled.library import CompiledStep

if TYPE_CHECKING:
    from attnkit.models.draft import ShallowDraft
    from attnkit.models.seq2seq import EncoderDecoder

# Process-wide, as the libraries they load are: a step is compiled or loaded once, whichever search,
# stream or server request asks first, and then shared.
_COMPILING = threading.Lock()  # one compile at a time; the streams then share the result
# each model's steps built so far, by (beams per source, serial loops): (weights' fingerprint, step or None)
_BUILT: weakref.WeakKeyDictionary[nn.Module, dict[tuple[int, bool], tuple]] = weakref.WeakKeyDictionary()
# each model's steps' keys in the cache, by (beams per source, serial loops): (weights' fingerprint, key)
_KEYS: weakref.WeakKeyDictionary[nn.Module, dict[tuple[int, bool], tuple]] = weakref.WeakKeyDictionary()
_KEYING = threading.Lock()  # (not the compile's lock: a key is wanted while another step compiles)


def weights_fingerprint(model: EncoderDecoder | ShallowDraft) -> tuple:
    """Changes whenever a weight its steps read does (an optimizer step, loading other weights): every
    such weight's address and version (``step_weights``: a walk of its modules, under a millisecond for
    a small Transformer), so a search takes it once and hands it to each function here that asks
    (``fingerprint``), and the helpers hand it down."""
    return tuple((w.data_ptr(), w._version) for w in model.step_weights().values())


def step_package(model: EncoderDecoder, beams: int, serial: bool, fingerprint: tuple | None = None) -> Path:
    """Where the compiled step of ``model`` for ``beams`` (its loops ``serial`` or not) is kept, whether
    built yet or not: its key hashes every weight, so it is worked out once per weights and kept for the
    process (``fingerprint``: the weights' :func:`weights_fingerprint`, where the caller has taken it)."""
    with _KEYING:
        fingerprint, variant = fingerprint or weights_fingerprint(model), (beams, serial)
        known = _KEYS.setdefault(model, {})
        if variant not in known or known[variant][0] != fingerprint:
            known[variant] = (fingerprint, cache_key(model, beams, serial))
        return cache_folder() / f"{known[variant][1]}.pt2"


def _at_hand(model: EncoderDecoder, width: int, serial: bool, fingerprint: tuple) -> bool | None:
    """Whether the step of ``model`` (its weights' ``fingerprint``) for ``width`` is there: loaded in this
    process, or in the cache folder to load (True); not built yet (False); or not to be had (None: it
    failed in this process)."""
    loaded = _BUILT.get(model, {}).get((width, serial))
    if loaded is not None and loaded[0] == fingerprint:
        return None if loaded[1] is None else True
    return step_package(model, width, serial, fingerprint).is_file()


def to_build(
    model: EncoderDecoder, widths: list[int], serial: bool, fingerprint: tuple | None = None
) -> list[int]:
    """Those of ``widths`` whose steps of ``model`` a :func:`compiled_step` call would build: neither
    loaded in this process nor in the cache folder (none where the model cannot be compiled)."""
    if not compilable(model):
        return []
    fingerprint = fingerprint or weights_fingerprint(model)
    return [width for width in widths if _at_hand(model, width, serial, fingerprint) is False]


def _built_loops(model: EncoderDecoder, width: int, serial: bool, fingerprint: tuple) -> bool | None:
    """The loops (serial or not) of a built step of ``model`` for ``width``, ``serial`` if both are
    built; None where neither is (loaded in this process, or in the cache folder to load)."""
    for loops in (serial, not serial):
        if _at_hand(model, width, loops, fingerprint):
            return loops
    return None


def all_built(model: EncoderDecoder, widths: list[int], fingerprint: tuple | None = None) -> bool:
    """Whether the steps of ``model`` for each of ``widths`` (beams per source, or :data:`FIRST_STEP`)
    are built, with loops of either kind: loaded in this process, or in the cache folder to load (a
    stat of a file each, once the key is known)."""
    if not compilable(model):
        return False
    fingerprint = fingerprint or weights_fingerprint(model)
    return all(_built_loops(model, width, True, fingerprint) is not None for width in widths)


def compiled_step(
    model: EncoderDecoder,
    beams: int,
    serial: bool,
    warn: Callable[[str], None] | None = None,
    may_build: bool = True,
    fingerprint: tuple | None = None,
) -> CompiledStep | None:
    """The compiled step of ``model`` for searches of ``beams`` rows per source (greedy: 1;
    :data:`FIRST_STEP`: the first step, the encoder with it), its loops ``serial`` (for searches on one
    thread each) or parallel: built (where it ``may_build``), or loaded from the cache folder, the first
    time; None, with a note to ``warn``, where it cannot be, and without a note where it is not built
    yet and may not be (a later call looks again). Where it may not build, a step of the other kind of
    loops serves if that one is built: the two give the same bits, so whether a search takes compiled
    steps does not depend on ``decode.streams``."""
    fingerprint = fingerprint or weights_fingerprint(model)
    if not may_build and compilable(model):
        built_loops = _built_loops(model, beams, serial, fingerprint)
        serial = serial if built_loops is None else built_loops
    package = step_package(model, beams, serial, fingerprint) if compilable(model) else None
    variant = (beams, serial)
    with _COMPILING:
        built = _BUILT.setdefault(model, {})
        if variant in built and built[variant][0] == fingerprint:
            return built[variant][1]
        if package is not None and not may_build and not package.is_file():
            return None
        built[variant] = (fingerprint, None)
        if package is None:
            if warn is not None and may_build:
                warn(
                    "decode.steps: this model's steps are not compiled (an encoder-decoder on the CPU in "
                    "float32, without model.copy, is); it decodes with its own"
                )
            return None
        try:
            if not package.is_file():
                missing = missing_compiler()
                if missing:
                    raise RuntimeError(missing)
                build_once(package, lambda: build(model, beams, package, serial))  # or another process's
            os.utime(package)  # used now: the cache keeps the most recently used steps
            prune_cache(keep=package)
            step = CompiledStep(package, copies=max(2, torch.get_num_threads()))  # one per stream
            expected = len(traced(model, beams)[1])
            if step.inputs != expected:  # a step of another layout under this key (a development build
                # that kept attnkit's version and the layout's number): called, it would abort the process
                raise RuntimeError(
                    f"{package} takes {step.inputs} inputs where this attnkit passes {expected} (built by "
                    "another attnkit); attnkit cache clear deletes it"
                )
        except Exception as error:  # any failure of the compiler or loader: decode as usual
            if warn is not None:
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                warn(
                    f"decode.steps: could not compile the decoding step ({reason[:200]}); it decodes "
                    "with the model's own steps"
                )
            return None
        built[variant] = (fingerprint, step)
        return step
