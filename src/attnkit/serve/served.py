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
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch

from attnkit.config import RunConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.streams import stream_count

PRIVATE_DATA_FIELDS = ("dir", "train", "valid", "test", "store")  # where the run's files were
MAX_WORKER_PROCESSES = 4  # running batches in processes of their own, unless decode.streams asks for more
# what a request's inputs are searched with, which the batcher groups them by: a translator's
# BeamSettings, a decoder's Sampling, None for the models with none of their own
Settings = TypeVar("Settings", bound=Hashable)
Loaded = TypeVar("Loaded", bound="AttnkitModel")


@dataclass
class ServedModel(Generic[Settings]):
    checkpoint: Path  # the folder it was loaded from (GET /info says it)
    tokenizer: Tokenizer

    engine: ClassVar[str]  # "attnkit" or "ctranslate2"
    dialects: ClassVar[tuple[str, ...]]  # the endpoints it answers (serve/endpoints: ROUTERS)
    shows_attention: ClassVar[bool] = False  # whether explore() has attention weights to show
    steps_continuously: ClassVar[bool] = False  # whether running_batch() has one to give

    def tokens(self, texts: list[str]) -> list[int]:
        """How many tokens each text is (for the length limits and the batches' token budget)."""
        return [len(ids) for ids in self.tokenizer.encode_batch(texts)]

    def positions(self, tokens: list[int], settings: Settings) -> int:
        """The token positions the rows of inputs of ``tokens`` hold at most with ``settings`` (each row
        its input and the longest output it may write): what a batch's ``--max-batch-positions`` counts.
        One row an input, nothing written, unless the model says otherwise."""
        return sum(tokens)

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

    def run(self, inputs: list[Any], settings: Settings) -> list[Any]:
        """Each input's output (blocking; called by one of the batcher's workers, ``streams`` at a time
        in all)."""
        raise NotImplementedError

    def running_batch(self) -> Any:
        """A running batch that inputs join at any step (``--batching continuous``, serve/continuous.py),
        where the model has one (``steps_continuously``)."""
        raise NotImplementedError

    def running_batch_process(
        self, deadline_s: float, preload: str | None = None
    ) -> Callable[[], Any] | None:
        """What makes :meth:`running_batch` in a process of its own (serve/worker_process.py), answering
        each step within ``deadline_s`` and started with the allocator library ``preload``, where the
        model can be made there; None where it cannot (the batcher's threads then step it here)."""
        return None

    def worker_processes(self) -> int:
        """How many running batches in processes of their own serve it."""
        return self.streams

    def steps(self) -> str | None:
        """What its searches step with (``/health`` says it): ``compiled`` or ``eager`` (a translator's
        ``decode.steps``); None for a model that has no such choice."""
        return None

    def steps_builder(self, warn: Callable[[str], None]) -> Callable[[], Any] | None:
        """What builds, in a process of its own, the compiled steps that the model would serve faster with
        (``decode.steps=auto``, where they are not built yet); its own steps serve meanwhile. None where
        there is nothing to build (``warn`` hears why, where the model serves slower for it)."""
        return None

    def abandon(self, inputs: list[Any]) -> None:
        """Nobody waits for ``inputs`` any more (their client has gone): work on them may stop early.
        Called on the event loop, perhaps while their batch runs on a worker."""


@dataclass
class AttnkitModel(ServedModel[Settings]):
    """A checkpoint run by attnkit itself: its model, run config and device."""

    model: torch.nn.Module
    config: RunConfig
    device: torch.device

    engine: ClassVar[str] = "attnkit"
    shows_attention: ClassVar[bool] = True
    decodes: ClassVar[bool] = True  # whether it takes decode settings (every model takes a precision)
    # the kinds of drafts its running batches check (decode.speculative's kinds; CHECKPOINT_DRAFTS: another
    # checkpoint's model); the server loads the others without them
    drafts: ClassVar[tuple[str, ...]] = ()

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

    @classmethod
    def architectures(cls) -> tuple[str, ...]:
        """The architectures (``model.arch``) it serves (serve/models.py chooses by them)."""
        raise NotImplementedError

    @classmethod
    def load(cls: type[Loaded], ckpt: str | Path, overrides: list[str], *, device: str = "cpu") -> Loaded:
        """A checkpoint (or run directory: its best) of one of its :meth:`architectures`, its decode
        settings changed by ``overrides``, ready to serve (:meth:`warm_up` done)."""
        from attnkit.checkpoint.folder import resolve_checkpoint
        from attnkit.loading import load_for_inference

        checkpoint = resolve_checkpoint(ckpt)
        model, tokenizer, config = load_for_inference(
            checkpoint, device, arch=cls.architectures(), overrides=overrides
        )
        served = cls(checkpoint, tokenizer, model, config, torch.device(device))
        served.warm_up()
        return served

    def warm_up(self) -> None:
        """Whatever the model needs done before the server says it is ready (a translator builds its
        compiled step, a predictor checks its head); nothing here."""

    def worker_processes(self) -> int:
        """How many running batches in processes of their own serve it: ``decode.streams`` where given,
        else one per thread up to :data:`MAX_WORKER_PROCESSES` (each loads a copy of the model: a
        server's memory must not grow with the machine's cores)."""
        if self.config.decode.streams:
            return self.workers
        return min(self.workers, MAX_WORKER_PROCESSES)

    def running_batch_process(
        self, deadline_s: float, preload: str | None = None
    ) -> Callable[[], Any] | None:
        """A child process that makes the model again from this one's weights in memory
        (:class:`MadeAgain`) and keeps its running batch, answering each step within ``deadline_s``
        (on a CPU: a GPU's memory would hold the model twice); started with the allocator library
        ``preload`` (cpu/allocator.py)."""
        if self.device.type != "cpu" or not self.steps_continuously:
            return None
        from attnkit.serve.worker_process import WorkerProcess

        return partial(WorkerProcess, MadeAgain(self), deadline_s=deadline_s, preload=preload)

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
class ReadsUploads(AttnkitModel[None]):
    """A model whose inputs are files uploaded to the server (images, sound), not text: the endpoints
    of serve/endpoints/uploads.py read each file of the form field ``field`` with :meth:`read_upload`
    (its header only: what it is, how large, so what it costs), batch the uploads by :meth:`cost`,
    and answer with each one's output named ``output``; the file is decoded (:meth:`decoded`) on the
    batcher's worker, once its request has its place in the queue. Its explorer asks for a file with
    a form and shows :meth:`explore_upload`'s page."""

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
        """An uploaded file's bytes with its header read and checked (a format and size the model
        reads), nothing decoded; what it cannot read is a one-line :class:`~attnkit.errors.DataError`
        naming ``name``."""
        raise NotImplementedError

    def cost(self, upload: Any) -> int:
        """What an upload costs a batch, in ``unit``s (``--max-batch-tokens`` bounds a request's), known
        from its header."""
        raise NotImplementedError

    def decode_input(self, upload: Any) -> Any:
        """An upload decoded as the model reads it (pixels, features)."""
        raise NotImplementedError

    def decoded(self, upload: Any) -> Any:
        """:meth:`decode_input`, on a worker; a file whose data breaks past its header is a one-line
        :class:`~attnkit.errors.DataError` naming the field and the file (a 422)."""
        from attnkit.errors import DataError

        try:
            return self.decode_input(upload)
        except DataError as error:
            raise DataError(f"{self.field}: {error}") from None

    def positions(self, tokens: list[int], settings: None) -> int:
        """Each upload's rows (the run's beam) × its ``unit``s and the longest output the model writes."""
        beam = self.config.decode.beam_size
        return sum(beam * (cost + self.model.config.max_len) for cost in tokens)

    def explore_upload(self, upload: Any, name: str, base: str) -> str:
        """The explorer's page for an upload (the file ``name``), with the upload form (to ``base``) on
        top."""
        raise NotImplementedError

    @classmethod
    def architectures(cls) -> tuple[str, ...]:
        from attnkit.models import archs

        return archs(reading=cls.reading, writing="text")

    def run(self, inputs: list[Any], settings: None) -> list[str]:
        """Each upload's output (an image's caption, an utterance's transcript: what ``attnkit predict``
        prints for its file), by the task's ``infer`` and the run's decode settings."""
        from attnkit.tasks import task_of

        decoded = [self.decoded(upload) for upload in inputs]
        return task_of(self.config).infer(self.model, self.tokenizer, self.config, decoded, self.device)

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


# AttnkitModel.drafts' name for decode.speculative=PATH: another checkpoint's model as the draft
CHECKPOINT_DRAFTS = "checkpoint"


class MadeAgain:
    """How a child process makes a served model again and then calls its method ``then`` (its running
    batch, or the build of its compiled steps): the model made again from what this server holds in
    memory (its class, the checkpoint's name, the run config with its precision resolved, the tokenizer,
    the weights, with its draft's: ``decode.speculative``), never read from the checkpoint folder (nor
    the draft checkpoint's), which may have been moved, rotated away by a run still training, or
    unmounted since the server loaded it. The weights are serialised (safetensors) only when this is
    pickled for a new process, and not kept."""

    def __init__(self, served: AttnkitModel, then: str = "running_batch") -> None:
        self.served, self.then = served, then

    def __reduce__(self) -> tuple[Any, ...]:
        s = self.served
        tokenizer = s.tokenizer.to_str() if s.tokenizer is not None else None
        held = (type(s), s.checkpoint, s.config.to_dict(), tokenizer, weights_bytes(s.model), str(s.device))
        draft = getattr(s.model, "draft", None)  # its weights are the model's draft.*: its config is held
        drafted = draft.config if draft is not None and s.config.decode.speculative != "shallow" else None
        return (partial, (made_again_then, self.then, *held, drafted))


def weights_bytes(model: torch.nn.Module) -> bytes:
    """``model``'s weights as a safetensors file's bytes, a tensor shared by several names (tied
    embeddings) under one of them only, as safetensors' ``save_model`` keeps it (``load_weights`` ties
    the others to it again)."""
    from safetensors.torch import save

    kept: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            kept[name] = tensor.detach().to("cpu").contiguous()
    return save(kept)


def made_again_then(
    then: str, served: type[AttnkitModel], checkpoint: Path, config: dict[str, Any], tokenizer: str | None,
    weights: bytes, device: str, draft: Any = None,
) -> Any:  # fmt: skip
    """In a child process: the served model made again from what :class:`MadeAgain` carried, and what
    its method ``then`` gives (its running batch is warmed up first). Its draft is made before the
    weights are loaded, which hold the draft's: a draft decoder (``decode.speculative=shallow``), or the
    model of ``draft``, another checkpoint's model config."""
    from safetensors.torch import load

    from attnkit.loading import build_for_tokenizer, ready_for_inference
    from attnkit.models import build_model, load_weights
    from attnkit.models.draft import draft_for

    run = RunConfig.from_dict(config, f"{checkpoint.name}/config.json")
    text = (
        Tokenizer.from_str(tokenizer, f"{checkpoint.name}/tokenizer.json") if tokenizer is not None else None
    )
    model = build_for_tokenizer(run, text)
    if run.decode.speculative == "shallow":
        model.draft = draft_for(model)
    elif draft is not None:
        model.draft = build_model(draft, text.vocab_size if text is not None else None)
    missing, unexpected = load_weights(model, load(weights))
    if missing or unexpected:
        raise RuntimeError(
            f"the weights held do not fit the model (missing {missing[:3]}, extra {unexpected[:3]})"
        )
    copy = served(checkpoint, text, ready_for_inference(model, run, device), run, torch.device(device))
    if then == "running_batch":
        copy.warm_up()
    return getattr(copy, then)()
