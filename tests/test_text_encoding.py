"""Every text file is read and written as UTF-8, whatever the locale (a minimal container or a cron job
runs under ``LC_ALL=C``, where Python's default for files is ASCII).

This test is the lint rule: it walks the code of the package, the benchmarks and the tests and finds
each call that opens text without naming its encoding: ``open(...)`` and ``Path.open(...)`` in a text
mode, ``read_text()``/``write_text()``, ``gzip.open(..., "rt")``, ``NamedTemporaryFile("w")`` and
``subprocess.run(..., text=True)``. (Ruff's ``PLW1514`` sees only the first of these, and only in
preview.)"""

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
CHECKED = ("src", "bench", "tests")
COMPRESSED = {"gzip", "bz2", "lzma"}  # their open() is binary unless the mode says "t"
NO_TEXT = {
    "Image",
    "os",
    "tarfile",
    "wave",
    "zipfile",
}  # modules whose open() reads no text (an image: Pillow's, a descriptor, an archive, sound)
SUBPROCESS = {"run", "check_output", "Popen", "check_call", "call"}


def _mode(call: ast.Call, position: int) -> str | None:
    """The mode argument of an open-like call (None: not given); ``"b"`` where every mode it can be is
    binary (``"ab" if have else "wb"``), ``"?"`` where it cannot be read."""
    argument = next((k.value for k in call.keywords if k.arg == "mode"), None)
    if argument is None and len(call.args) > position:
        argument = call.args[position]
    if argument is None:
        return None
    if isinstance(argument, ast.IfExp):
        branches = {_constant(argument.body), _constant(argument.orelse)}
        return "b" if all(b and "b" in b for b in branches) else "?"
    return _constant(argument) or "?"


def _constant(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _opens_text_without_encoding(call: ast.Call) -> bool:
    keywords = {keyword.arg for keyword in call.keywords}
    if "encoding" in keywords:
        return False
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
    if name in ("read_text", "write_text"):
        return isinstance(func, ast.Attribute)  # Path's methods, not a function of that name
    if name == "open" and owner in COMPRESSED:
        mode = _mode(call, 1)
        return mode is not None and "t" in mode
    if name == "open" and owner in NO_TEXT:
        return False
    if name == "open":
        mode = _mode(call, 1 if isinstance(func, ast.Name) or owner == "io" else 0)  # Path.open(mode)
        return mode is None or "b" not in mode
    if name in ("NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"):
        mode = _mode(call, 0)
        return mode is not None and "b" not in mode
    if name in SUBPROCESS and owner == "subprocess":
        return any(
            keyword.arg in ("text", "universal_newlines")
            and not (isinstance(keyword.value, ast.Constant) and keyword.value.value is False)
            for keyword in call.keywords
        )
    return False


def text_opened_without_encoding(root: Path = ROOT) -> list[str]:
    """``file:line`` of each call that opens text without naming its encoding."""
    found = []
    for folder in CHECKED:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and _opens_text_without_encoding(node):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_text_file_names_its_encoding():
    assert text_opened_without_encoding() == []


def test_the_check_finds_what_it_looks_for(tmp_path):
    """The rule itself: each form is found, each binary or encoded one is not."""
    bad = ['open("f")', 'open("f", "w")', 'Path("f").open()', 'Path("f").read_text()', 'p.write_text("x")',
           'gzip.open("f", "rt")', 'tempfile.NamedTemporaryFile("w")', 'subprocess.run(["ls"], text=True)',
           'io.open("f", "r")']  # fmt: skip
    good = ['open("f", "rb")', 'open("f", encoding="utf-8")', 'Path("f").open("wb")', "p.read_bytes()",
            'p.read_text(encoding="utf-8")', 'gzip.open("f")', 'gzip.open("f", "rt", encoding="utf-8")',
            "tempfile.NamedTemporaryFile()", 'subprocess.run(["ls"], capture_output=True)',
            'os.open("f", os.O_RDONLY)', 'open("f", "ab" if have else "wb")', 'tarfile.open("f")',
            "read_text(path)", 'subprocess.run(["ls"], text=True, encoding="utf-8")']  # fmt: skip
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "bad.py").write_text("\n".join(bad), encoding="utf-8")
    (tmp_path / "src" / "good.py").write_text("\n".join(good), encoding="utf-8")
    for folder in CHECKED[1:]:
        (tmp_path / folder).mkdir()
    assert text_opened_without_encoding(tmp_path) == [f"src/bad.py:{i}" for i in range(1, len(bad) + 1)]
