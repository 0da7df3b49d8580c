"""A checkpoint's files read with one-line errors (checkpoint/files.py): a missing, unreadable or
corrupt file is an ``AttnkitError`` naming it; a whole one reads back what was written."""

import pytest
import torch
from safetensors.torch import save_file

from attnkit.checkpoint.files import read_json, read_safetensors
from attnkit.errors import AttnkitError


def test_json_reads_back_and_a_missing_or_broken_file_is_named(tmp_path):
    good = tmp_path / "config.json"
    good.write_text('{"model": {"d_model": 32}}', encoding="utf-8")
    assert read_json(good) == {"model": {"d_model": 32}}
    with pytest.raises(AttnkitError, match=r"gone\.json: missing from the checkpoint"):
        read_json(tmp_path / "gone.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": ', encoding="utf-8")
    with pytest.raises(AttnkitError, match=r"broken\.json: not readable JSON"):
        read_json(broken)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"name": "caf\xe9"}')  # not UTF-8
    with pytest.raises(AttnkitError, match=r"latin\.json: not readable JSON"):
        read_json(latin)


def test_safetensors_read_back_and_a_truncated_file_is_named(tmp_path):
    weights = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3, dtype=torch.bfloat16)}
    whole = tmp_path / "model.safetensors"
    save_file(weights, str(whole))
    read = read_safetensors(whole)
    assert read.keys() == weights.keys() and all(torch.equal(read[k], weights[k]) for k in weights)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(whole.read_bytes()[:-8])  # a copy that stopped short
    with pytest.raises(AttnkitError, match=r"cut\.safetensors: corrupt or truncated"):
        read_safetensors(cut)
    with pytest.raises(AttnkitError, match=r"none\.safetensors: missing from the checkpoint"):
        read_safetensors(tmp_path / "none.safetensors")
