"""A translation model's decoding step compiled ahead of time, for CPU translation (``decode.compile``).

Why: one step of a search (``Seq2SeqDecoding.next_logits``) is about a hundred small PyTorch operations
between a few matrix products, each issued from Python. Traced once and compiled, the step becomes one
function of C++ loops around oneDNN's products, with the weights packed at compile time and the
residual sums, layer norms and attention scaling fused: on 2 CPU cores, beam 5 over Multi30k's test set
took 1.16x less time, with the same 500 outputs (``bench/translate_speed.py --compile``).

How:
- ``torch.export`` traces the model's own :meth:`EncoderDecoder.decode` with a KV cache rebuilt from
  tensors (:class:`_CachedStep`), so there is no second copy of the decoder to keep in step with the
  first; the cached length, the rows and the source length are symbols, so one compiled step serves
  every batch. AOTInductor compiles it (with frozen weights) into a shared library, once per model and
  beam width: about 20 s, then kept in ``$XDG_CACHE_HOME/attnkit/steps`` under a key of the weights,
  the model's settings, the torch version and the processor's instruction sets, so that later runs
  load it in a moment. The cache is bounded: steps unused for 30 days go, and beyond 2 GiB the least
  recently used; ``attnkit cache clear`` empties it.
- The library is called through ``ctypes``, which lets go of Python's lock for the whole step;
  PyTorch's own loader keeps it, which would let only one of the decoding streams (streams.py) run at a
  time. Its container holds one copy of the step per stream.
- A search takes the step through :class:`CompiledDecoding`, the model's own decoding with its
  ``next_logits`` swapped, which :func:`compiled_decoding` hands to the search: the model knows
  nothing of it.
- Only the steps after the first, one new token per row, take the compiled path; the first (which
  also computes the cross-attention's keys) stays eager, as do models the trace cannot express (the
  copy mechanism, another device or dtype: :func:`compilable`). Attention weights are not recorded
  on the compiled path (``attention/recording.py``); the plots and the explorer run the model, not a
  search. Where compiling fails (no C++ compiler, say), :func:`compiled_step` says so once and
  translation goes on without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import shutil
import tempfile
import threading
import time
import weakref
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

import attnkit
from attnkit.models.seq2seq import Seq2SeqDecoding

if TYPE_CHECKING:
    from attnkit.models.seq2seq import EncoderDecoder

_COMPILING = threading.Lock()  # one compile at a time; the streams then share the result
# each model's steps built so far, by beams per source: (weights' fingerprint, step or None)
_BUILT: weakref.WeakKeyDictionary[nn.Module, dict[int, tuple]] = weakref.WeakKeyDictionary()


class _CachedStep(nn.Module):
    """``model.decode`` of one new token per row with a cache made of tensors, as export traces it:
    ``(new (R, 1), order (R,), src_mask (R, 1, S), the layers' self-attention keys, their values,
    cross-attention keys, values)`` -> ``(logits (R, V), new self-attention keys..., values...)``.
    ``order`` picks each row's cached keys (beam search's re-ranking, dropped sentences)."""

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, new: Tensor, order: Tensor, src_mask: Tensor, *cached: Tensor) -> tuple[Tensor, ...]:
        cache = self.model.new_cache()
        n = len(cache.layers)
        for i, layer in enumerate(cache.layers):
            layer.self_attn._key, layer.self_attn._value = cached[i], cached[n + i]
            layer.self_attn._order = order
            layer.src_attn._key, layer.src_attn._value = cached[2 * n + i], cached[3 * n + i]
        unused_memory = cached[2 * n]  # the cross-attention reads its cache, not the memory
        hidden = self.model.decode(unused_memory, src_mask, new, cache=cache)[:, -1]  # (R, d_model)
        keys = [layer.self_attn._key for layer in cache.layers]
        values = [layer.self_attn._value for layer in cache.layers]
        return (self.model.generator(hidden), *keys, *values)


def _example(model: EncoderDecoder, beams: int) -> tuple[tuple[Tensor, ...], tuple]:
    """Inputs to trace with (sizes all different, so that none is taken for another) and their
    dynamic sizes: sources N, rows R = N·beams, cached rows before the step, cached length, source
    length."""
    from torch.export import Dim

    c = model.config
    n, h, d_k = c.decoder_layers, c.h, c.d_model // c.h
    sources, before, length, source_len = 6, 33, 5, 9
    rows = sources * beams
    inputs = (
        torch.randint(4, 20, (rows, 1)),
        torch.randint(0, before, (rows,)),
        torch.ones(rows, 1, source_len, dtype=torch.bool),
        *[torch.randn(before, h, length, d_k) for _ in range(2 * n)],
        *[torch.randn(sources, h, source_len, d_k) for _ in range(2 * n)],
    )
    N = Dim("sources", min=1, max=4096)
    R = N * beams if beams > 1 else N
    # a cached length leaves room for the new position; a source has at most max_len tokens
    cached, source = Dim("cached", min=1, max=c.max_len - 1), Dim("source_len", min=1, max=c.max_len)
    self_kv = {0: Dim("before", min=1, max=4096 * beams), 2: cached}
    shapes = ({0: R}, {0: R}, {0: R, 2: source}, (*[self_kv] * (2 * n), *[{0: N, 2: source}] * (2 * n)))
    return inputs, shapes


def cpu_capabilities() -> str:
    """The processor the step is compiled for: its architecture, the vector instructions torch uses
    on it, and every instruction-set flag the system reports (Linux: ``/proc/cpuinfo``). Code built for
    a processor with AVX-512 crashes on one without, so a cache folder shared by machines (a home
    folder on a cluster's file system) must keep their steps apart."""
    flags = ""
    with contextlib.suppress(OSError):
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        flags = next((line for line in cpuinfo.splitlines() if line.startswith(("flags", "Features"))), "")
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{platform.machine()} {platform.processor()} {capability} {' '.join(sorted(flags.split()))}"


def cache_key(model: EncoderDecoder, beams: int) -> str:
    """What the compiled step depends on: the weights, the model's settings, the beam width, torch's
    and attnkit's versions, and the processor it runs on."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    settings = {"config": repr(model.config), "beams": beams, "torch": torch.__version__,
                "attnkit": attnkit.__version__, "cpu": cpu_capabilities()}  # fmt: skip
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:32]


def cache_folder() -> Path:
    """Where compiled steps are kept: ``$XDG_CACHE_HOME/attnkit/steps`` (``~/.cache/attnkit/steps``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnkit" / "steps"


# --- the cache, bounded ------------------------------------------------------------------------------

MAX_CACHE_BYTES = 2 * 2**30  # beyond this the least recently used steps go (each is 1-50 MB)
MAX_CACHE_DAYS = 30  # a step unused for this long goes


def cached_steps(folder: Path | None = None) -> list[tuple[Path, int, float]]:
    """Each step in the cache: ``(package, bytes with its unpacked library, last used)``, least recently
    used first (a step's package is touched each time it is loaded)."""
    folder = folder or cache_folder()
    steps = []
    for package in folder.glob("*.pt2") if folder.is_dir() else []:
        unpacked = package.with_suffix(".unpacked")
        files = [package, *(unpacked.rglob("*") if unpacked.is_dir() else [])]
        with contextlib.suppress(OSError):  # another process pruned it meanwhile
            size = sum(f.stat().st_size for f in files if f.is_file())
            steps.append((package, size, package.stat().st_mtime))
    return sorted(steps, key=lambda step: step[2])


def remove_step(package: Path) -> None:
    """Delete a cached step: its package and its unpacked library (a process still running it keeps its
    copy, which the system frees when the process lets go)."""
    package.unlink(missing_ok=True)
    shutil.rmtree(package.with_suffix(".unpacked"), ignore_errors=True)


def prune_cache(keep: Path | None = None, now: float | None = None) -> list[Path]:
    """Delete the steps unused for :data:`MAX_CACHE_DAYS` days, then the least recently used until the
    cache holds at most :data:`MAX_CACHE_BYTES` (never ``keep``, the step in hand); returns the deleted."""
    now = time.time() if now is None else now
    steps = cached_steps()
    total = sum(size for _, size, _ in steps)
    removed = []
    for package, size, used in steps:
        if package == keep:
            continue
        if now - used > MAX_CACHE_DAYS * 86400 or total > MAX_CACHE_BYTES:
            remove_step(package)
            removed.append(package)
            total -= size
    return removed


def build(model: EncoderDecoder, beams: int, package: Path) -> None:
    """Export and compile the step into the AOTInductor package ``package`` (written atomically)."""
    import torch._inductor.config as inductor

    inputs, shapes = _example(model, beams)
    with torch.no_grad():
        program = torch.export.export(_CachedStep(model).eval(), inputs, dynamic_shapes=shapes)
        package.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=package.parent) as work:
            written = Path(work) / package.name
            with inductor.patch(freezing=True):  # weights as constants: packed once, for oneDNN
                torch._inductor.aoti_compile_and_package(program, package_path=str(written))
            os.replace(written, package)


class CompiledStep:
    """A step :func:`build` compiled, loaded from ``package`` with ``copies`` copies (one per stream, so
    that the streams never wait for each other); loaded once per model and kept for the process."""

    def __init__(self, package: Path, copies: int) -> None:
        library = _shared_library(package)
        self._library = ctypes.CDLL(str(library))  # ctypes calls let go of Python's lock
        self._container = ctypes.c_void_p()
        created = self._library.AOTInductorModelContainerCreateWithDevice(
            ctypes.byref(self._container), ctypes.c_size_t(copies), b"cpu", None
        )
        if created != 0:
            raise RuntimeError(f"{library}: the compiled step did not load")
        outputs = ctypes.c_size_t()
        self._library.AOTInductorModelContainerGetNumOutputs(self._container, ctypes.byref(outputs))
        self._outputs = outputs.value
        run = self._library.AOTInductorModelContainerRun
        pointers = ctypes.POINTER(ctypes.c_void_p)
        run.argtypes = [ctypes.c_void_p, pointers, ctypes.c_size_t, pointers, ctypes.c_size_t,
                        ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
        self._run = run

    def __call__(self, *tensors: Tensor) -> list[Tensor]:
        """Run the step: its inputs, contiguous (the library takes the strides it was compiled for on
        trust), in; its outputs out."""
        handles = [_pointer(c) for c in torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(list(tensors))]
        inputs = (ctypes.c_void_p * len(handles))(*handles)  # the library takes these handles over
        outputs = (ctypes.c_void_p * self._outputs)()
        if self._run(self._container, inputs, len(handles), outputs, self._outputs, None, None) != 0:
            raise RuntimeError("the compiled decoding step failed")
        made = [_capsule(outputs[i], None, None) for i in range(self._outputs)]
        return torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs(made)

    def next_logits(self, decoding: Seq2SeqDecoding, tokens: Tensor) -> Tensor:
        """:meth:`Seq2SeqDecoding.next_logits` for one new token per row, the cache moved on as the
        eager step moves it."""
        layers = decoding.cache.layers
        order = layers[0].self_attn._order  # the same in every layer
        if order is None:
            order = torch.arange(tokens.size(0))
        kept = [layer.self_attn._key.contiguous() for layer in layers]
        kept += [layer.self_attn._value.contiguous() for layer in layers]
        kept += [layer.src_attn.key.contiguous() for layer in layers]  # (the sources kept: applied)
        kept += [layer.src_attn.value.contiguous() for layer in layers]
        out = self(tokens[:, -1:].contiguous(), order, decoding.src_mask.contiguous(), *kept)
        n = len(layers)
        for i, layer in enumerate(layers):
            layer.self_attn._key, layer.self_attn._value = out[1 + i], out[1 + n + i]
            layer.self_attn._order = None
        return out[0]


def _shared_library(package: Path) -> Path:
    """The step's shared library, unpacked next to its package (once)."""
    folder = package.with_suffix(".unpacked")
    if not folder.is_dir():
        work = Path(tempfile.mkdtemp(dir=package.parent, prefix=f".{folder.name}."))
        zipfile.ZipFile(package).extractall(work)
        try:
            os.replace(work, folder)
        except OSError:  # another process unpacked it first
            shutil.rmtree(work, ignore_errors=True)
    return next(folder.glob("*/data/aotinductor/model/*.so"))


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def _pointer(capsule: object) -> int:
    return _get_pointer(capsule, None)


_capsule = ctypes.pythonapi.PyCapsule_New
_capsule.restype, _capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def compilable(model: nn.Module) -> bool:
    """Whether the step of ``model`` can be compiled: a Transformer encoder-decoder on the CPU in
    float32, without the copy mechanism (its extra inputs are not traced)."""
    from attnkit.models.seq2seq import EncoderDecoder

    weight = next(model.parameters())
    return (
        isinstance(model, EncoderDecoder)
        and model.pointer is None
        and weight.is_cpu
        and weight.dtype == torch.float32
        and hasattr(torch._C, "_aoti")
    )


def _fingerprint(model: nn.Module) -> tuple:
    """Changes whenever a weight does (an optimizer step, loading other weights): cheap to take."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def compiled_step(
    model: EncoderDecoder, beams: int, warn: Callable[[str], None] | None = None
) -> CompiledStep | None:
    """The compiled step of ``model`` for searches of ``beams`` rows per source (greedy: 1): built, or
    loaded from the cache folder, the first time; None, with a note to ``warn``, where it cannot be."""
    with _COMPILING:
        built = _BUILT.setdefault(model, {})
        fingerprint = _fingerprint(model)
        if beams in built and built[beams][0] == fingerprint:
            return built[beams][1]
        built[beams] = (fingerprint, None)
        if not compilable(model):
            if warn is not None:
                warn("decode.compile: this model's step is not compiled (an encoder-decoder on the CPU in "
                     "float32, without model.copy, is); it decodes as usual")  # fmt: skip
            return None
        package = cache_folder() / f"{cache_key(model, beams)}.pt2"
        try:
            if not package.is_file():
                if warn is not None:
                    warn(f"decode.compile: compiling the decoding step for beam {beams} (about 20 s, once; "
                         f"kept in {package.parent}; attnkit cache clear deletes it)")  # fmt: skip
                build(model, beams, package)
            os.utime(package)  # used now: the cache keeps the most recently used steps
            prune_cache(keep=package)
            step = CompiledStep(package, copies=max(2, torch.get_num_threads()))  # one per stream
        except Exception as error:  # any failure of the compiler or loader: decode as usual
            if warn is not None:
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                warn(f"decode.compile: could not compile the decoding step ({reason[:200]}); it decodes "
                     "as usual")  # fmt: skip
            return None
        built[beams] = (fingerprint, step)
        return step


class CompiledDecoding(Seq2SeqDecoding):
    """``model.decoding(src)`` whose steps after the first, one new token per row at ``step``'s beam
    width, run the compiled step; every other step (the first, which also computes the cross-attention
    keys, or another beam width) runs the model as usual."""

    def __init__(self, model: EncoderDecoder, src: Tensor, use_cache: bool, step: CompiledStep, beams: int):
        super().__init__(model, src, use_cache)
        self.step, self.step_beams = step, beams

    def next_logits(self, tokens: Tensor) -> Tensor:
        cached = self.cache is not None and 0 < len(self.cache) == tokens.size(1) - 1
        if cached and self.beams == self.step_beams:
            return self.step.next_logits(self, tokens)
        return super().next_logits(tokens)


def compiled_decoding(
    model: EncoderDecoder, beams: int, warn: Callable[[str], None] | None = None
) -> Callable[[Tensor, bool], Seq2SeqDecoding] | None:
    """What searches of ``model`` with ``beams`` rows per source decode with to take its compiled step
    (:func:`compiled_step`): ``decoding(src, use_cache)``, as ``model.decoding``; None where there is
    no compiled step (the search then takes ``model.decoding``)."""
    step = compiled_step(model, beams, warn)
    if step is None:
        return None
    return lambda src, use_cache=True: CompiledDecoding(model, src, use_cache, step, beams)
