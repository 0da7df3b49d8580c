"""Small runs that tests train for themselves: a tiny Transformer on generated dates."""

from pathlib import Path

from attnkit.config import load_run_config
from attnkit.train.loop import Trainer


def trained_dates(folder: Path, *settings: str) -> Path:
    """``folder`` holding a run of the tiny preset on generated dates (character tokens, beam 4), with
    ``settings`` (``section.field=value``: its data's size, its steps) on top."""
    tiny = ["model.preset=tiny", "data.task=dates", "data.tokenizer=char", "decode.beam_size=4"]
    Trainer(load_run_config(None, [*tiny, *settings]), folder, echo=lambda message: None).fit()
    return folder
