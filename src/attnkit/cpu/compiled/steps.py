"""The compiled step of a model: built or loaded from the cache the first time a search asks for it,
then kept for the process (each model's, by beam width, until its weights change)."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from attnkit.cpu.compiled.build import FIRST_STEP, build, compilable
from attnkit.cpu.compiled.cache import cache_folder, cache_key, prune_cache
from attnkit.cpu.compiled.library import CompiledStep

if TYPE_CHECKING:
    from attnkit.models.seq2seq import EncoderDecoder

# Process-wide, as the libraries they load are: a step is compiled or loaded once, whichever search,
# stream or server request asks first, and then shared.
_COMPILING = threading.Lock()  # one compile at a time; the streams then share the result
# each model's steps built so far, by beams per source: (weights' fingerprint, step or None)
_BUILT: weakref.WeakKeyDictionary[nn.Module, dict[int, tuple]] = weakref.WeakKeyDictionary()


def _fingerprint(model: nn.Module) -> tuple:
    """Changes whenever a weight does (an optimizer step, loading other weights): cheap to take."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def compiled_step(
    model: EncoderDecoder, beams: int, warn: Callable[[str], None] | None = None
) -> CompiledStep | None:
    """The compiled step of ``model`` for searches of ``beams`` rows per source (greedy: 1;
    :data:`FIRST_STEP`: the first step, the encoder with it): built, or loaded from the cache folder,
    the first time; None, with a note to ``warn``, where it cannot be."""
    with _COMPILING:
        built = _BUILT.setdefault(model, {})
        fingerprint = _fingerprint(model)
        if beams in built and built[beams][0] == fingerprint:
            return built[beams][1]
        built[beams] = (fingerprint, None)
        if not compilable(model):
            if warn is not None:
                warn(
                    "decode.compile: this model's step is not compiled (an encoder-decoder on the CPU in "
                    "float32, without model.copy, is); it decodes as usual"
                )
            return None
        package = cache_folder() / f"{cache_key(model, beams)}.pt2"
        try:
            if not package.is_file():
                if warn is not None:
                    which = f"the decoding step for beam {beams}"
                    which = "the first decoding step" if beams == FIRST_STEP else which
                    warn(
                        f"decode.compile: compiling {which} (about 20 s, once; kept in {package.parent}; "
                        "attnkit cache clear deletes it)"
                    )
                build(model, beams, package)
            os.utime(package)  # used now: the cache keeps the most recently used steps
            prune_cache(keep=package)
            step = CompiledStep(package, copies=max(2, torch.get_num_threads()))  # one per stream
        except Exception as error:  # any failure of the compiler or loader: decode as usual
            if warn is not None:
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                warn(
                    f"decode.compile: could not compile the decoding step ({reason[:200]}); it decodes "
                    "as usual"
                )
            return None
        built[beams] = (fingerprint, step)
        return step
