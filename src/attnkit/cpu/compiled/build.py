"""The traced step compiled by AOTInductor into a package holding a shared library (about 20 s)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from attnkit.cpu.compiled.trace import CachedStep, CheckStep, FirstStep, RankedStep, example, first_example

if TYPE_CHECKING:
    from attnkit.models.seq2seq import EncoderDecoder


def compilable(model: nn.Module) -> bool:
    """Whether the step of ``model`` can be compiled: a Transformer encoder-decoder (or its shallow draft
    decoder) on the CPU in float32, without the copy mechanism (its extra inputs are not traced)."""
    from attnkit.models.draft import ShallowDraft
    from attnkit.models.seq2seq import EncoderDecoder

    weight = next(model.parameters())
    return (
        isinstance(model, (EncoderDecoder, ShallowDraft))
        and model.pointer is None
        and weight.is_cpu
        and weight.dtype == torch.float32
        and hasattr(torch._C, "_aoti")
    )


def missing_compiler() -> str | None:
    """Why this machine cannot compile a step (no C++ compiler where AOTInductor looks for one: ``$CXX``,
    else ``g++``), or None where it can."""
    import torch._inductor.config as inductor

    compiler = inductor.cpp.cxx[1] if inductor.cpp.cxx[0] is None else inductor.cpp.cxx[0]
    if shutil.which(str(compiler)) is None:
        return f"no C++ compiler ({compiler}) on this machine: apt-get install g++, or set CXX"
    return None


def loop_settings(serial: bool) -> dict[str, object]:
    """How AOTInductor writes the step's loops. Left to itself it writes them for the threads of the
    process that compiles (``torch.get_num_threads()``): OpenMP loops over that many threads, or over
    whatever the caller has where that count is the machine's ``os.cpu_count()``, and plain loops on one
    thread. So a step's speed depended on which process built it first: called on one thread (each of
    ``translate``'s streams), a step of parallel loops took 6% longer than one of plain loops (the
    Multi30k model, beam 5, 2-core AMD EPYC), and on a machine whose torch threads are fewer than its
    logical processors, each stream's every loop would start all of the compiling process's threads.
    Now the build says which: plain loops (``serial``), or OpenMP loops that take the calling thread's
    count (``dynamic_threads``). Either way a row's sums run in the same order (the loops split rows
    among threads, not a row's sum), so both give the same bits (tests/cpu/test_compiled.py)."""
    return {"cpp.threads": 1} if serial else {"cpp.dynamic_threads": True}


FIRST_STEP = 0  # in place of a beam width: the first step (trace.FirstStep), which every width shares
# in place of a beam width: greedy search's step of several new tokens per row (trace.CheckStep), which
# checks a draft's tokens (decode/speculative.py)
CHECK_STEP = -1


def traced(model: EncoderDecoder, width: int) -> tuple[nn.Module, tuple[Tensor, ...], tuple]:
    """The step of ``model`` for ``width`` (beams per source, :data:`FIRST_STEP` or :data:`CHECK_STEP`)
    as export traces it, with the inputs to trace it with and their dynamic sizes."""
    if width == FIRST_STEP:
        return FirstStep(model), *first_example(model)
    if width == CHECK_STEP:
        return CheckStep(model), *example(model, 1, checked=True)
    step = CachedStep(model) if width == 1 else RankedStep(model, width)  # beam search's ranks
    return step, *example(model, width)


def build(model: EncoderDecoder, beams: int, package: Path, serial: bool) -> None:
    """Export and compile the step for ``beams`` rows per source (:data:`FIRST_STEP`: the first step;
    :data:`CHECK_STEP`: the check of drafts) into the AOTInductor package ``package`` (written
    atomically), its loops ``serial`` (for a search on one thread) or parallel over as many threads as
    the search that calls it has (:func:`loop_settings`)."""
    import torch._inductor.config as inductor

    step, inputs, shapes = traced(model, beams)
    with torch.no_grad():
        program = torch.export.export(step.eval(), inputs, dynamic_shapes=shapes)
        package.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=package.parent) as work:
            written = Path(work) / package.name
            # freezing: weights as constants, packed once for oneDNN; pointwise concatenation: the
            # self-attention's past keys and the new one are read where they are (trace.py), not copied
            # into one tensor first (the CPU default); precision casts kept: a fused kernel would
            # otherwise skip the rounding of a value cast down and up again, and a check step's
            # position read a key of a position before it unrounded, where the step of one token
            # reads it from the bf16 history (its logits' last bits differed)
            settings = {"freezing": True, "force_pointwise_cat": True, "emulate_precision_casts": True}
            with inductor.patch({**settings, **loop_settings(serial)}):
                torch._inductor.aoti_compile_and_package(program, package_path=str(written))
            os.replace(written, package)
