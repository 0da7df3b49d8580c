"""The precisions a batch-invariance test runs in: bf16 only where this CPU's oneDNN sums a bf16 row the
same way among any number of rows (``attnkit.cpu.linear.bf16_rows_alike``; on AMX tiles it does not, and
a sentence's bf16 output may then differ in its last bits with its batch: docs/invariance.md)."""

from __future__ import annotations

import pytest

from attnkit.cpu.linear import bf16_rows_alike

BF16_ROWS_DIFFER = (
    "this CPU's oneDNN sums a bf16 row in an order that depends on the rows multiplied with it (AMX "
    "tiles): bf16 is not batch invariant here (docs/invariance.md)"
)
needs_bf16_rows_alike = pytest.mark.skipif(not bf16_rows_alike(), reason=BF16_ROWS_DIFFER)
BF16 = pytest.param("bf16", marks=needs_bf16_rows_alike)
PRECISIONS = ["fp32", BF16, "int8"]
