"""What every model the server runs has: a folder loaded once, a tokenizer, and what the app asks of it.

Two engines run a model: attnkit's own (:class:`AttnkitModel`: a checkpoint, its PyTorch model and run
config) and CTranslate2 (serve/ctranslate2.py: a folder that ``attnkit export --to ctranslate2``
wrote). The app sees only what this base class has: token counts for the limits, a description for
``GET /info``, the attention explorer's page where the engine has attention weights to show, and
``run``, the blocking call the batcher makes on one of its workers (``abandon`` when a request's client
has gone while its batch runs).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import torch

from attnkit.config import RunConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.streams import stream_count

PRIVATE_DATA_FIELDS = ("dir", "train", "valid", "test", "store")  # where the run's files were


@dataclass
class ServedModel:
    checkpoint: Path  # the folder it was loaded from (GET /info says it)
    tokenizer: Tokenizer

    engine: ClassVar[str]  # "attnkit" or "ctranslate2"
    dialects: ClassVar[tuple[str, ...]]  # the endpoints it answers (serve/endpoints: ROUTERS)
    shows_attention: ClassVar[bool] = False  # whether explore() has attention weights to show
    steps_continuously: ClassVar[bool] = False  # whether running_batch() has one to give

    def tokens(self, texts: list[str]) -> list[int]:
        """How many tokens each text is (for the length limits and the batches' token budget)."""
        return [len(ids) for ids in self.tokenizer.encode_batch(texts)]

    def output_tokens(self, text: str) -> int:
        """How many tokens an output is (the metrics' output tokens)."""
        return len(self.tokenizer.encode(text)) if text else 0

    def describe(self) -> dict[str, Any]:
        """What ``GET /info`` says of the model: its engine, architecture, task and settings."""
        raise NotImplementedError

    def explore(self, text: str, target: str | None, base: str, limit: int) -> tuple[str, int]:
        """The attention explorer's page on ``text`` (at most ``limit`` tokens of it, and of the output)
        and its HTTP status, where the engine has attention weights (``shows_attention``)."""
        raise NotImplementedError

    @property
    def streams(self) -> int:
        """Batches run at a time (the batcher's workers)."""
        return 1

    def prepare_worker(self, running: int) -> None:
        """Ready a worker thread of the batcher for a batch, ``running`` batches at once with it."""

    def run(self, inputs: list[Any], settings: Hashable) -> list[Any]:
        """Each input's output (blocking; called by one of the batcher's workers, ``streams`` at a time
        in all)."""
        raise NotImplementedError

    def running_batch(self) -> Any:
        """A running batch that inputs join at any step (``--batching continuous``, serve/continuous.py),
        where the model has one (``steps_continuously``)."""
        raise NotImplementedError

    def running_batch_process(self) -> Callable[[], Any] | None:
        """What makes :meth:`running_batch` in a process of its own (serve/engine_process.py), where the
        model can be loaded there; None where it cannot (the batcher's threads then step it here)."""
        return None

    def abandon(self, inputs: list[Any]) -> None:
        """Nobody waits for ``inputs`` any more (their client has gone): work on them may stop early.
        Called on the event loop, perhaps while their batch runs on a worker."""


@dataclass
class AttnkitModel(ServedModel):
    """A checkpoint run by attnkit itself: its model, run config and device."""

    model: torch.nn.Module
    config: RunConfig
    device: torch.device
    # how another process loads this model as it was loaded here (same checkpoint and settings, the
    # precision this one resolved to): a running batch in a process of its own (engine_process.py)
    reload: Callable[[], AttnkitModel] | None = field(default=None, repr=False, compare=False)

    engine: ClassVar[str] = "attnkit"
    shows_attention: ClassVar[bool] = True

    def __post_init__(self) -> None:
        # torch's threads as the model loaded, shared out among the workers (which change the count
        # that new threads start with, so it is read once, here)
        self.threads = torch.get_num_threads()
        self.workers = stream_count(self.config.decode.streams, self.device, self.threads)

    @property
    def streams(self) -> int:
        """``decode.streams`` batches at a time (0: one per thread), each on its share of torch's
        threads, as ``attnkit translate`` runs its batches (decode/streams.py)."""
        return self.workers

    def prepare_worker(self, running: int) -> None:
        """A batch alone takes every thread; batches side by side share them (a batch that began alone
        keeps its threads until it ends, so for a while the CPU may hold more threads than cores)."""
        torch.set_num_threads(max(1, self.threads // running))

    def running_batch_process(self) -> Callable[[], Any] | None:
        """A child process that loads the model again and keeps its running batch (on a CPU: a GPU's
        memory would hold the model twice)."""
        if self.reload is None or self.device.type != "cpu" or not self.steps_continuously:
            return None
        from attnkit.serve.engine_process import EngineProcess, running_batch_of

        return partial(EngineProcess, partial(running_batch_of, self.reload))

    def describe(self) -> dict[str, Any]:
        """The model's architecture and the settings a client may want: the model, its decoding and its
        data's task and tokenizer; not the training run's files and folders (paths of this machine)."""
        config = self.config.to_dict()
        data = {key: value for key, value in config["data"].items() if key not in PRIVATE_DATA_FIELDS}
        return {"engine": self.engine, "arch": self.config.model.arch, "task": self.config.data.task,
                "config": {"model": config["model"], "data": data, "decode": config["decode"]}}  # fmt: skip

    def explore(self, text: str, target: str | None, base: str, limit: int) -> tuple[str, int]:
        from attnkit.viz.explorer import explorer_page

        return explorer_page(self.model, self.tokenizer, self.checkpoint.name, text, target, base, limit)


@dataclass
class ReadsUploads(AttnkitModel):
    """A model whose inputs are files uploaded to the server (images, sound), not text: the endpoints
    of serve/endpoints/uploads.py read each file of the form field ``field`` with :meth:`read_upload`,
    batch the inputs by :meth:`cost`, and answer with each one's output named ``output``; its explorer
    asks for a file with a form and shows :meth:`explore_upload`'s page."""

    dialects: ClassVar[tuple[str, ...]] = ("uploads",)
    reading: ClassVar[str]  # what its architectures read (models.archs): "images", "audio"
    field: ClassVar[str]  # the form field of the files: "image", "audio"
    example: ClassVar[str]  # how to upload one: "curl -F image=@scene.png"
    output: ClassVar[str]  # what an input's output is called in an answer: "caption", "transcript"
    unit: ClassVar[str]  # what an input costs a batch, counted like a sentence's tokens: "regions"
    reads: ClassVar[str]  # what the model does, for a page asked with text: "captions images"
    asks: ClassVar[str]  # what the explorer's page asks for: "upload an image to see ..."
    upload_form: ClassVar[str]  # the explorer's upload form (HTML, ``{action}`` its address)

    def read_upload(self, data: bytes, name: str) -> Any:
        """An uploaded file's bytes as the model's input; what it cannot read is a one-line
        :class:`~attnkit.errors.DataError` naming ``name``."""
        raise NotImplementedError

    def cost(self, item: Any) -> int:
        """What an input costs a batch, in ``unit``s (``--max-batch-tokens`` bounds a request's)."""
        raise NotImplementedError

    def explore_upload(self, item: Any, name: str, base: str) -> str:
        """The explorer's page for an input (the file ``name``), with the upload form (to ``base``) on
        top."""
        raise NotImplementedError

    @classmethod
    def load(cls, ckpt: str | Path, overrides: list[str], *, device: str = "cpu") -> ReadsUploads:
        """A checkpoint (or run directory: its best) of a model that reads ``reading`` and writes text,
        ready to serve."""
        from attnkit.checkpoint.folder import resolve_checkpoint
        from attnkit.loading import load_for_inference
        from attnkit.models import archs

        checkpoint = resolve_checkpoint(ckpt)
        model, tokenizer, config = load_for_inference(
            checkpoint, device, arch=archs(reading=cls.reading, writing="text"), overrides=overrides
        )
        return cls(checkpoint, tokenizer, model, config, torch.device(device))

    def run(self, inputs: list[Any], settings: Hashable) -> list[str]:
        """Each input's output (an image's caption, an utterance's transcript: what ``attnkit predict``
        prints for its file), by the task's ``infer`` and the run's decode settings."""
        from attnkit.tasks import task_of

        return task_of(self.config).infer(self.model, self.tokenizer, self.config, inputs, self.device)

    def explore(self, text: str, target: str | None, base: str, limit: int) -> tuple[str, int]:
        """The explorer's upload form (``POST`` to the same address); a 400 for text, which the model
        does not read."""
        from attnkit.viz.explorer import message_page

        if not text.strip():
            return message_page(self.asks, base, self.upload_form), 200
        said = f"this model {self.reads}, it reads no text: {self.asks}"
        return message_page(said, base, self.upload_form), 400


def form_for_uploads(field: str, accept: str, button: str) -> str:
    """An explorer's form that uploads one file in ``field`` (of the types ``accept`` names) to
    ``{action}``."""
    return (
        '<form method="post" action="{action}" enctype="multipart/form-data" id="ask">\n'
        f'<input type="file" name="{field}" accept="{accept}">\n'
        f'<button type="submit">{button}</button></form>'
    )


def reloading(load: Callable[..., AttnkitModel], checkpoint: Path, overrides: list[str], config: RunConfig,
              device: str) -> Callable[[], AttnkitModel]:  # fmt: skip
    """``load(checkpoint, overrides, device=device)`` as it loaded a model whose run config came out as
    ``config``, its precision pinned (``auto`` probes the CPU, and times it: a busy machine could tell a
    second process otherwise): an :class:`AttnkitModel`'s ``reload``."""
    pinned = [*overrides, f"decode.precision={config.decode.precision}"]
    return partial(load, checkpoint, pinned, device=device)
