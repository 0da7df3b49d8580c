"""What the tests of compiled steps share: the mark that skips them without a C++ compiler, and the
counting of the steps' calls, to show that a search took the compiled path, not the eager one."""

import shutil

import pytest

from attnkit.cpu.compiled.library import CompiledStep

NEEDS_COMPILER = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None,
    reason="compiling the steps needs a C++ compiler (apt-get install g++)",
)


class CountingCalls:
    """Counts every compiled step's calls (``calls``) while the test's ``monkeypatch`` holds."""

    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        run = CompiledStep.__call__

        def counted(step, *tensors):
            self.calls += 1
            return run(step, *tensors)

        monkeypatch.setattr(CompiledStep, "__call__", counted)
