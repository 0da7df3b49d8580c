"""A compiled step's shared library loaded and called through ``ctypes``, which lets go of Python's lock
for the whole step (PyTorch's own loader keeps it, so only one decoding stream could run at a time)."""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import torch
from torch import Tensor


class CompiledStep:
    """A step that build.py compiled, loaded from ``package`` with ``copies`` copies (one per stream, so
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
        outputs, inputs = ctypes.c_size_t(), ctypes.c_size_t()
        self._library.AOTInductorModelContainerGetNumOutputs(self._container, ctypes.byref(outputs))
        self._library.AOTInductorModelContainerGetNumInputs(self._container, ctypes.byref(inputs))
        self._outputs, self.inputs = outputs.value, inputs.value  # (a call with other inputs aborts)
        run = self._library.AOTInductorModelContainerRun
        pointers = ctypes.POINTER(ctypes.c_void_p)
        # (container, inputs, how many, outputs, how many, stream, proxy executor)
        run.argtypes = [ctypes.c_void_p, pointers, ctypes.c_size_t, pointers, ctypes.c_size_t]
        run.argtypes += [ctypes.c_void_p, ctypes.c_void_p]
        self._run = run

    def __call__(self, *tensors: Tensor) -> list[Tensor]:
        """Run the step: its inputs in, made contiguous where they are not (the library takes the
        strides it was compiled for on trust, and would read a strided view wrongly); its outputs out."""
        tensors = tuple(t if t.is_contiguous() else t.contiguous() for t in tensors)
        handles = [_pointer(c) for c in torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(list(tensors))]
        inputs = (ctypes.c_void_p * len(handles))(*handles)  # the library takes these handles over
        outputs = (ctypes.c_void_p * self._outputs)()
        if self._run(self._container, inputs, len(handles), outputs, self._outputs, None, None) != 0:
            raise RuntimeError("the compiled decoding step failed")
        made = [_capsule(outputs[i], None, None) for i in range(self._outputs)]
        return torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs(made)


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
