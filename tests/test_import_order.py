"""Imports run one way: each module of attnkit imports only from its own layer or the layers below it
(the order is written once, below, and drawn in docs/architecture.md), and no modules import each other
in a circle. Imports inside functions count too: a late import is still a dependency."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "attnkit"

# bottom to top: a module's layer is the one with the longest prefix of its dotted name
ORDER = [
    (
        "ground",
        [
            "attnkit.errors",
            "attnkit.atomic",
            "attnkit.folders",
            "attnkit.utf8",
            "attnkit.metrics",
            "attnkit.processes",
            "attnkit.ranking",
            "attnkit.lazy",
        ],
    ),
    ("attention", ["attnkit.attention"]),
    ("nn", ["attnkit.nn"]),
    ("models", ["attnkit.models", "attnkit"]),  # "attnkit" alone: the package root, the paper's parts
    ("cpu", ["attnkit.cpu"]),  # the CPU fast path, applied to built models from above
    ("data", ["attnkit.data"]),
    ("config", ["attnkit.task_records", "attnkit.config"]),  # the run config, and the tasks' records it reads
    ("checkpoint", ["attnkit.checkpoint"]),  # the format: read, write, sharded
    ("loading", ["attnkit.loading"]),  # a model loaded to work with, CPU speed-ups applied
    ("convert", ["attnkit.convert"]),  # above the checkpoint format it reads and writes
    ("decode", ["attnkit.decode"]),  # searches and text in, text out: what tasks infer and score with
    ("tasks", ["attnkit.tasks"]),
    ("train", ["attnkit.train"]),
    ("viz", ["attnkit.viz"]),
    ("quickstart", ["attnkit.quickstart"]),
    ("serve", ["attnkit.serve"]),  # the HTTP server of a trained model, on the decoding and task layers
    ("cli", ["attnkit.cli", "attnkit.__main__"]),
]
# imports that still run upward, each to be removed (the test fails when one is gone, so this shrinks)
STILL_UPWARD: set[tuple[str, str]] = set()


def layer(module: str) -> int:
    """The index in ORDER of ``module``'s layer; a module of no layer fails (place a new one in ORDER)."""
    matches = [
        (len(prefix), i)
        for i, (_, prefixes) in enumerate(ORDER)
        for prefix in prefixes
        if module == prefix or (prefix != "attnkit" and module.startswith(prefix + "."))
    ]
    assert matches, f"{module} is in no layer of ORDER"
    return max(matches)[1]


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of the package -> the attnkit modules it imports (``from attnkit import x``: x)."""
    modules = {module_name(path, root): path for path in root.rglob("*.py")}
    found: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = found.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.split(".")[0] == "attnkit")
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "attnkit":
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    targets.add(submodule if submodule in modules else node.module)
    return found


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in graph.items() for b in targets if layer(b) > layer(a)}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (Tarjan's algorithm)."""
    index, low, stack, on_stack, groups, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_every_module_has_a_layer():
    for module in imports():
        layer(module)


def test_imports_run_downward_only():
    found = upward(imports())
    assert found - STILL_UPWARD == set(), "imports that run up the layers"
    assert STILL_UPWARD - found == set(), "no longer upward: delete them from STILL_UPWARD"


def test_no_modules_import_each_other_in_a_circle():
    assert circles(imports()) == []


def test_the_check_sees_an_upward_import_and_a_circle(tmp_path):
    """The rule itself, on a made-up package: a task importing the trainer, and two modules in a circle."""
    package = tmp_path / "attnkit"
    for name, text in {
        "__init__.py": "",
        "errors.py": "",
        "tasks/__init__.py": "",
        "tasks/a.py": "def f():\n    from attnkit.train.loop import Trainer\n",
        "train/__init__.py": "",
        "train/loop.py": "from attnkit import errors\nfrom attnkit.train import other\n",
        "train/other.py": "import attnkit.train.loop\n",
    }.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text, encoding="utf-8")
    graph = imports(package)
    assert upward(graph) == {("attnkit.tasks.a", "attnkit.train.loop")}
    assert circles(graph) == [["attnkit.train.loop", "attnkit.train.other"]]
