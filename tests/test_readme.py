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
