"""A CTranslate2 folder that attnkit exported (checkpoint/ctranslate2_folder.py): what it holds, and
the command that runs it."""

import json

from attnkit.checkpoint.ctranslate2_folder import MODEL_FILE, ctranslate2_command, exported_model


def test_a_folder_says_what_model_it_holds_and_an_older_one_a_translation_model(tmp_path):
    (tmp_path / MODEL_FILE).write_text(json.dumps({"arch": "decoder", "context": 256}), encoding="utf-8")
    assert exported_model(tmp_path) == {"arch": "decoder", "context": 256}
    older = tmp_path / "older"
    older.mkdir()
    assert exported_model(older) == {"arch": "encoder-decoder"}


def test_the_command_is_the_architectures_main_one_on_ctranslate2(tmp_path):
    assert (
        ctranslate2_command(tmp_path, "encoder-decoder")
        == f"attnkit translate --engine ctranslate2 --ckpt {tmp_path}"
    )
    assert (
        ctranslate2_command(tmp_path, "decoder") == f"attnkit generate --engine ctranslate2 --ckpt {tmp_path}"
    )
