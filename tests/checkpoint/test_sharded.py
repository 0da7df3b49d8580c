"""The sharded checkpoint format (what train.parallel=fsdp saves), in one process: written through DCP
as safetensors, read back whole, and a lost or cut shard file is a one-line error naming it. (Two
processes writing one checkpoint: tests/train/test_fsdp.py.)"""

import warnings

import pytest
import torch
from safetensors import safe_open

from attnkit.checkpoint.folder import holds_weights, read_weights
from attnkit.checkpoint.sharded import SHARDED, read_whole, seal, without_ties, write_shards
from attnkit.errors import AttnkitError


@pytest.fixture
def sharded(tmp_path):
    embedding = torch.randn(7, 4)
    model = {"embed.weight": embedding, "output.weight": embedding, "norm.bias": torch.randn(4)}  # tied
    optimizer = {"optimizer.0.exp_avg": torch.randn(7, 4), "optimizer.0.step": torch.tensor(3.0)}
    with warnings.catch_warnings():  # DCP without a process group says it writes as one process
        warnings.simplefilter("ignore", UserWarning)
        write_shards(tmp_path, {"model": without_ties(model), "optimizer": optimizer})
    seal(tmp_path)
    return tmp_path, model, optimizer


def test_shards_read_back_whole_with_tied_tensors_written_once(sharded):
    folder, model, optimizer = sharded
    assert holds_weights(folder) and not (folder / "model.safetensors").exists()
    weights = read_weights(folder)
    assert weights.keys() == {"embed.weight", "norm.bias"}  # loading re-ties output.weight
    for name, tensor in weights.items():
        assert torch.equal(tensor, model[name])
    read = read_whole(folder, "optimizer")
    assert all(torch.equal(read[name], optimizer[name]) for name in optimizer)


def test_no_pickle_in_a_sharded_checkpoint(sharded):
    """Every file is safetensors or JSON: nothing a reader must unpickle (DCP's default .metadata is)."""
    folder = sharded[0]
    files = [path for path in (folder / SHARDED).rglob("*") if path.is_file()]
    assert sorted(path.suffix for path in files) == [".json", ".safetensors", ".safetensors"]
    for path in files:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:  # parses as safetensors
                assert list(f.keys())


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_lost_or_cut_shard_file_is_an_error_naming_it(sharded, damage):
    folder = sharded[0]
    shard = next((folder / SHARDED / "model").glob("*.safetensors"))
    if damage == "missing":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:-10])
    said = rf"{shard.name}: (missing|\d+ bytes), but the checkpoint was saved"
    with pytest.raises(AttnkitError, match=said):
        read_weights(folder)


@pytest.mark.parametrize(
    ("listed", "said"),
    [
        (
            {"../../../../etc/passwd": 1},
            r"'\.\./\.\./\.\./\.\./etc/passwd' is not a shard file of the checkpoint",
        ),
        ({"/etc/passwd": 1}, r"'/etc/passwd' is not a shard file"),
        ({"model/../../x.safetensors": 1}, r"'model/\.\./\.\./x\.safetensors' is not a shard file"),
        ({"model/a.safetensors": "big"}, r"'model/a.safetensors' has no size in bytes"),
        ([1, 2], r"not the checkpoint's list of shard files"),
    ],
)
def test_a_files_list_that_points_outside_the_checkpoint_or_is_no_list_is_one_line(sharded, listed, said):
    """files.json names the shard files to check; a planted one used to reveal the size of any file on the
    machine in its error (or, not an object, end in a 119-line traceback)."""
    import json

    folder = sharded[0]
    (folder / SHARDED / "files.json").write_text(json.dumps(listed), encoding="utf-8")
    with pytest.raises(AttnkitError, match=r"files\.json: " + said):
        read_weights(folder)
