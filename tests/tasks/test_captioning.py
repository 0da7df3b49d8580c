"""Image captioning on digit scenes through the one training loop and CLI: a captioner trains, its
checkpoints hold its caption words (tokenizer.json), ``attnkit evaluate`` scores the held-out scenes
(BLEU, exact match, attention on the named digit) and draws its attention word by word, ``attnkit predict
--image`` captions image files, and the task and the model ask for each other."""

import re

import matplotlib.image
import pytest
from typer.testing import CliRunner

from attnkit.checkpoint.folder import resolve_checkpoint
from attnkit.cli import app
from attnkit.config import load_run_config
from attnkit.data.digit_scenes import CELL_WORDS, digit_scenes
from attnkit.data.tokenizer import SPECIALS
from attnkit.decode.captions import caption
from attnkit.errors import ConfigError
from attnkit.loading import load_for_inference
from attnkit.tasks.captioning import pixels

pytest.importorskip("sklearn", reason="the scenes draw scikit-learn's bundled digits")

SHORT = [
    "data.n_train=640", "data.n_valid=64", "train.batch_size=32", "train.schedule=constant", "train.warmup=0",
    "train.lr=3e-3", "train.label_smoothing=0", "train.max_steps=120", "train.eval_every=60",
]  # fmt: skip
RNN = [
    "model.arch=show-attend-tell", "model.preset=captioner-tiny", "model.d_hidden=64", "model.channels=16",
    "model.doubly_stochastic=0.1",
]  # fmt: skip
MODELS = {
    "soft": [*RNN, "model.hard=false"],
    "hard": [*RNN, "model.hard=true"],
    "transformer": ["model.arch=caption-transformer", "model.preset=caption-transformer-tiny",
                    "model.d_model=64", "model.d_ff=128", "model.channels=16"],
}  # fmt: skip


@pytest.mark.parametrize("kind", list(MODELS))
def test_a_captioner_trains_and_is_evaluated_from_the_cli(tmp_path, kind):
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--run-dir", str(run), *SHORT, *MODELS[kind]])
    assert result.exit_code == 0, result.output
    final = re.search(
        r"final validation: valid_loss ([\d.]+), valid_ppl [\d.]+, valid_bleu ([\d.]+)", result.stdout
    )
    assert final, result.stdout
    assert float(final.group(1)) < 1.5 and float(final.group(2)) > 20, result.stdout  # the grammar is learned
    checkpoint = resolve_checkpoint(run)
    assert (checkpoint / "tokenizer.json").exists()
    _, tokenizer, config = load_for_inference(run)
    assert tokenizer.vocab_size == len(CELL_WORDS) + len(SPECIALS)  # the caption words and the specials
    assert config.model.image_size == 48 and config.data.task == "captions"
    assert getattr(config.model, "hard", False) == (kind == "hard")
    result = CliRunner().invoke(app, ["evaluate", "--ckpt", str(run)])
    assert result.exit_code == 0, result.output
    line = re.search(r"BLEU ([\d.]+), exact match ([\d.]+), attention on the named digit ([\d.]+), "
                     r"on 64 test scenes", result.stdout)  # fmt: skip
    assert line and float(line.group(1)) > 20, result.stdout
    result = CliRunner().invoke(app, ["evaluate", "--ckpt", str(run), "--src", "x.txt", "--ref", "y.txt"])
    assert result.exit_code == 2 and "generated test scenes" in result.output
    strips = tmp_path / "strips.png"
    result = CliRunner().invoke(app, ["evaluate", "--ckpt", str(run), "--plot", str(strips)])
    assert result.exit_code == 0 and f"attention, word by word: {strips}" in result.stdout, result.output
    assert strips.stat().st_size > 20_000  # four scenes, each word over its attention
    _predict_captions_image_files(run, tmp_path)


def _predict_captions_image_files(run, folder):
    """``attnkit predict --image``: each PNG's caption, what the model gives the scene's pixels; a file
    that is no image, one of another size and text given to a captioner are one line each."""
    scenes = digit_scenes("test", 3, seed=9)
    files = []
    for i in range(3):
        files.append(folder / f"scene{i}.png")
        matplotlib.image.imsave(files[-1], scenes.images[i].numpy(), cmap="gray", vmin=0, vmax=255)
    model, tokenizer, config = load_for_inference(run)
    expected = caption(model, tokenizer, pixels(scenes.images), config.decode)
    arguments = ["predict", "--ckpt", str(run)] + [a for f in files for a in ("--image", str(f))]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == expected
    if config.model.arch == "caption-transformer":  # greedy, checking a captioner's guesses: the same lines
        greedy = CliRunner().invoke(app, [*arguments, "decode.beam_size=1"])
        drafted = CliRunner().invoke(app, [*arguments, "decode.beam_size=1", f"decode.speculative={run}"])
        assert greedy.exit_code == drafted.exit_code == 0, drafted.output
        assert drafted.stdout == greedy.stdout and greedy.stdout.strip()
    small = folder / "small.png"
    matplotlib.image.imsave(small, scenes.images[0, :40, :40].numpy(), cmap="gray")
    (folder / "text.png").write_text("not an image", encoding="utf-8")
    for arguments, said in (
        (["--image", str(small)], f"{small}: an image of (40, 40) pixels; this model reads (48, 48)"),
        (["--image", str(folder / "text.png")], "text.png: not a PNG or JPEG image"),
        (["--text", "a 3"], "a captioner reads images, not text: give --image FILE"),
    ):
        result = CliRunner().invoke(app, ["predict", "--ckpt", str(run), *arguments])
        assert result.exit_code == 2 and said in result.output, result.output


def test_the_captioning_task_and_the_captioner_ask_for_each_other():
    config = load_run_config(None, ["model.arch=show-attend-tell"])  # the captioner's default task
    assert config.data.task == "captions" and config.train.eval_metric == "accuracy"
    with pytest.raises(ConfigError, match=r"show-attend-tell"):
        load_run_config(None, ["data.task=captions"])  # the default model is a translation model
    with pytest.raises(ConfigError, match=r"model\.local"):
        load_run_config(None, ["model.arch=show-attend-tell", "model.local=local-m"])
    with pytest.raises(ConfigError, match=r"model\.image_size must be a multiple of 8"):
        load_run_config(None, ["model.arch=show-attend-tell", "model.image_size=50"])
