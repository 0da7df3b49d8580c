"""Private torch interfaces (``torch._int_mm``, ``torch.ops.mkldnn.*``, ``torch._C._aoti``, ...) and
``ctypes`` may change with any torch release, so they live in one package, the CPU fast path
(``attnkit.cpu``), each behind a probe with a tested fallback; this test finds every use in attnkit and
fails on one anywhere else."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "attnkit"
ALLOWED = {
    "cpu/linear.py": "oneDNN's linear and packed weights, int8 products (F.linear without them)",
    "cpu/compiled/build.py": "AOTInductor's compiler, probed by compilable (the eager step without it)",
    "cpu/compiled/library.py": "the compiled step called through ctypes (the eager step without it)",
    "cpu/allocator.py": "ctypes.util.find_library, which loads nothing (the system's malloc without it)",
}


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _hidden(part: str) -> bool:
    """``_name`` is private; ``__version__`` and the like are public."""
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _private(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "ctypes" or (parts[0] == "torch" and any(_hidden(p) or p == "ops" for p in parts[1:]))


def private_uses(root: Path = PACKAGE) -> dict[str, list[str]]:
    """Each module's uses of a private torch interface or ctypes: ``{path: [what, ...]}``."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        uses = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                uses += [a.name for a in node.names if _private(a.name)]
            elif isinstance(node, ast.ImportFrom) and node.module and _private(node.module):
                uses.append(node.module)
            elif isinstance(node, ast.Attribute) and _private(name := _dotted(node)):
                uses.append(name)
        if uses:
            found[path.relative_to(root).as_posix()] = sorted(set(uses))
    return found


def test_private_torch_interfaces_and_ctypes_live_only_in_their_places():
    found = private_uses()
    assert set(found) - set(ALLOWED) == set(), {path: found[path] for path in set(found) - set(ALLOWED)}
    assert set(ALLOWED) - set(found) == set(), "no longer uses one: delete it from ALLOWED"


def test_the_check_finds_each_kind(tmp_path):
    package = tmp_path / "attnkit"
    package.mkdir()
    (package / "a.py").write_text("import torch\nx = torch._int_mm\ny = torch.ops.mkldnn._linear_pointwise\n",
                                  encoding="utf-8")  # fmt: skip
    (package / "b.py").write_text("import ctypes\nfrom torch._inductor import config\n", encoding="utf-8")
    (package / "c.py").write_text("import torch\nz = torch.nn.functional.linear\n", encoding="utf-8")
    assert private_uses(package) == {
        "a.py": ["torch._int_mm", "torch.ops", "torch.ops.mkldnn", "torch.ops.mkldnn._linear_pointwise"],
        "b.py": ["ctypes", "torch._inductor"],
    }


def test_the_places_are_the_cpu_package():
    assert all(path.startswith("cpu/") for path in ALLOWED)
