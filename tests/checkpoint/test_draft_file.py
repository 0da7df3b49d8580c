"""A checkpoint's draft decoder: written whole beside the model's weights, read back into a draft that
decodes as the one saved, refused in one line where it is missing or of another model's shape."""

from __future__ import annotations

import pytest
import torch

from attnkit import build_transformer
from attnkit.checkpoint.draft_file import attach_draft, draft_about, write_draft
from attnkit.errors import AttnkitError
from attnkit.models.config import TransformerConfig
from attnkit.models.draft import DRAFT_FILE, ShallowDraft


def _model(d_model: int = 32):
    torch.manual_seed(0)
    config = TransformerConfig.from_preset("tiny", d_model=d_model, d_ff=64, h=2, dropout=0.0)
    return build_transformer(config, 40).eval()


def test_a_written_draft_reads_back_the_same_and_says_what_made_it(tmp_path):
    model = _model()
    draft = ShallowDraft(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p))  # not the copy of the first layer a new draft starts as
    write_draft(tmp_path, draft, {"sentences": "12"})
    assert [p.name for p in tmp_path.iterdir()] == [DRAFT_FILE]  # no temporary file left
    again = attach_draft(model, tmp_path)
    assert model.draft is again
    src, tgt = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[1, 8, 9]])
    assert torch.equal(again(src, tgt), draft(src, tgt))
    assert draft_about(tmp_path)["sentences"] == "12"


def test_a_missing_or_misshapen_draft_is_one_line_naming_the_file(tmp_path):
    with pytest.raises(AttnkitError, match=r"has no draft decoder .* attnkit distill-draft --ckpt"):
        attach_draft(_model(), tmp_path)
    write_draft(tmp_path, ShallowDraft(_model(d_model=48)), {})
    with pytest.raises(AttnkitError, match=rf"{DRAFT_FILE}: a draft decoder of another shape"):
        attach_draft(_model(), tmp_path)


def test_a_draft_holds_its_one_layer_alone_and_starts_as_the_models_first():
    model = _model()
    draft = ShallowDraft(model)
    first = {
        n for n in model.decoder.state_dict() if not n.startswith("layers.") or n.startswith("layers.0.")
    }
    assert set(draft.state_dict()) == {f"decoder.{n}" for n in first}  # not the model's
    for name, tensor in draft.decoder.state_dict().items():
        assert torch.equal(tensor, model.decoder.state_dict()[name])
