"""The README's Python example runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs_and_prints_the_paper_base_size(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    exec(compile(blocks[0], str(README), "exec"), {})
    printed = capsys.readouterr().out
    assert "torch.Size([2, 7, 37000])" in printed
    assert "63,082,496 parameters" in printed


def test_readme_docs_and_recipes_cite_nothing_outside_the_repository():
    root = README.parent
    for path in [README, *root.glob("docs/*.md"), *root.glob("configs/*.yaml")]:
        text = path.read_text()
        assert not re.search(r"DESIGN\.md|STYLE\.md|\bissues? #?\d", text, flags=re.I), path
        if path.parent.name != "docs":  # docs/data.md says where the project's own machines keep data
            assert "../shared" not in text, path
        for link in re.findall(r"\]\(((?!https?:)[^)#]+)", text):  # local Markdown links exist
            assert (path.parent / link).exists(), (path, link)
