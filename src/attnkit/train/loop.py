"""The training loop: read it top to bottom, no callbacks.

``Trainer(config, run_dir).fit()`` prepares the data, builds the model and Adam(β1=0.9, β2=0.98,
ε=1e-9) with the chosen schedule (§5.3), then repeats: take ``update_freq`` token-budget batches,
accumulate the label-smoothed loss, clip, step; every ``eval_every`` steps validate (loss, perplexity,
greedy BLEU and exact match), save a checkpoint (atomically; ``best`` by ``eval_metric``) and maybe stop
early. ``resume=True`` restores weights, optimizer, schedule, RNG states and the position in the epoch
from the run's ``last`` checkpoint, so the continued run is the run that was interrupted.

A new run refuses a run directory that already holds a run, so that two runs' checkpoints never mix
(``overwrite=True`` deletes the earlier one's first). With several processes (torchrun) every process
starts from the same weights but draws dropout from its own seed, and every process's RNG state is
saved and restored: a resumed multi-process run is the uninterrupted one too.
"""

from __future__ import annotations

import copy
import csv
import math
import re
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from attnkit.atomic import atomic_writer
from attnkit.checkpoint.folder import load_model_weights, read_run_config, resolve_checkpoint, save_checkpoint
from attnkit.checkpoint.run_dir import clear_run, earlier_run, lock_run
from attnkit.checkpoint.trainer_state import load_trainer_state, rng_state
from attnkit.config import LOWER_IS_BETTER, RunConfig, TrainConfig
from attnkit.cpu import speed_up
from attnkit.errors import AttnkitError, ConfigError
from attnkit.loading import build_for_tokenizer, read_tokenizer
from attnkit.metrics import perplexity
from attnkit.models import unwrap
from attnkit.processes import close_world, init_world, resolve_device
from attnkit.tasks import make_task
from attnkit.tasks.protocol import Task, TaskFactory
from attnkit.train.distributed import fully_shard_model, shard, whole_root
from attnkit.train.precision import training_precision
from attnkit.train.pretrained import Pretrained, read_pretrained
from attnkit.train.schedules import learning_rate_fn, make_scheduler
from attnkit.train.tensorboard import TensorBoardLog, memory_used, require_tensorboard

LOG_FIELDS = ["step", "epoch", "lr", "train_loss", "train_ppl", "tokens_per_s"]  # then the task's scores


def _new_window() -> dict[str, float]:
    """Running sums of training statistics between two validations."""
    return {"loss": 0.0, "nll": 0.0, "tokens": 0.0, "began": time.perf_counter()}


def _ready_to_train(config: RunConfig) -> RunConfig:
    """A copy of ``config`` (the caller's stays as it was) checked for what training needs before any
    data is read, with ``data.dir`` resolved so that ``--resume`` works from any working directory."""
    config = copy.deepcopy(config)
    t = config.train
    if not (t.max_steps or t.max_epochs or t.max_minutes):
        raise ConfigError("set at least one of train.max_steps, train.max_epochs, train.max_minutes")
    if t.schedule == "cosine" and not (t.decay_steps or t.max_steps):
        raise ConfigError("train.schedule='cosine' decays over train.decay_steps or train.max_steps: set one")
    config.data.check_files_given()
    config.data.dir = str(Path(config.data.dir).resolve())
    if "tensorboard" in t.log:
        require_tensorboard()
    return config


# num_labels, image_size: a classifier's labels and an image model's size come from its data (data.labels,
# data.canvas), which the run keeps
RESUMABLE_MODEL_CHANGES = {"dropout", "attention_dropout", "activation_dropout", "num_labels", "image_size"}


def _check_resumable(saved: RunConfig, config: RunConfig) -> None:
    """A resumed run keeps its model and vocabulary: only dropout rates (and training and decoding
    settings) may change, since other model fields (``activation``, ``norm_first``, the position layout)
    would change the model silently, without any weight changing shape."""
    changed = [
        f"model.{name}={getattr(config.model, name)!r} (the run has {value!r})"
        for name, value in vars(saved.model).items()
        if name not in RESUMABLE_MODEL_CHANGES and getattr(config.model, name) != value
    ]
    changed += [
        f"data.{name}={getattr(config.data, name)!r} (the run has {getattr(saved.data, name)!r})"
        for name in ("tokenizer", "vocab_size", "canvas")
        if getattr(config.data, name) != getattr(saved.data, name)
    ]
    if config.train.freeze != saved.train.freeze:  # the optimizer's state covers the trained ones only
        changed.append(f"train.freeze={config.train.freeze!r} (the run has {saved.train.freeze!r})")
    if changed:
        raise ConfigError(
            f"a resumed run keeps its model and vocabulary, but {', '.join(changed)}; start a new run instead"
        )


FUSED_ADAMW_DEVICES = ("cpu", "cuda")  # where torch has a fused AdamW kernel that attnkit tests


def layer_lr_scale(name: str, model: torch.nn.Module, decay: float) -> float:
    """The factor ``decay ** (L + 1 - depth)`` on parameter ``name``'s learning rate, ``depth`` being 0
    for the embeddings and ``i + 1`` for encoder layer ``i`` of ``L``: heads (and a decoder) learn at
    the full rate, each layer below more slowly (layer-wise decay, Clark et al., 2020, ELECTRA)."""
    encoder = getattr(unwrap(model), "encoder", None)
    if decay == 1.0 or not isinstance(getattr(encoder, "layers", None), torch.nn.ModuleList):
        return 1.0
    top = len(encoder.layers) + 1
    if name.startswith(("embed.", "src_embed.", "src_pos.", "src_norm.")):
        return decay**top
    layer = re.match(r"encoder\.layers\.(\d+)\.", name)
    return decay ** (top - int(layer[1]) - 1) if layer else 1.0


def freeze(model: torch.nn.Module, prefixes: list[str]) -> int:
    """Stop training the parameters whose names start with one of ``prefixes`` (``train.freeze``);
    returns how many numbers that freezes. A prefix that names no parameter is an error that lists the
    model's top-level names, so that a typo does not train what was meant to stay."""
    frozen = 0
    for prefix in prefixes:
        chosen = [
            p for name, p in model.named_parameters() if name == prefix or name.startswith(f"{prefix}.")
        ]
        if not chosen:
            names = [name for name, _ in model.named_parameters()]
            tops = sorted({name.split(".")[0] for name in names})
            raise ConfigError(
                f"train.freeze: no parameter is named {prefix!r} or starts with '{prefix}.'; the model's "
                f"parameter names start with {', '.join(tops)} (the first is {names[0]!r})"
            )
        for p in chosen:
            frozen += p.numel() if p.requires_grad else 0
            p.requires_grad_(False)
    return frozen


def make_optimizer(model: torch.nn.Module, t: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """Adam(β1, β2, ε) with a learning rate of 1 (times ``train.layer_decay``'s factor, see
    :func:`layer_lr_scale`) that the schedule scales (the paper's §5.3); with
    ``train.weight_decay``, AdamW's decoupled decay of the weight matrices and embeddings only, not of
    biases and LayerNorm gains (Loshchilov & Hutter, 2019; nanoGPT). One fused kernel per step on CPUs
    and GPUs (HF's Trainer's default too): torch's per-tensor update allocates temporaries the size of
    every parameter, which for GPT-2's 50,257 x 768 embedding costs ~0.2 s a step on a 2-core CPU;
    the fused kernel updates all 124M parameters in 0.07 s instead of 0.54 s."""
    kinds: dict[tuple[bool, float], list[torch.nn.Parameter]] = {}  # (decays?, lr scale) -> parameters
    for name, p in model.named_parameters():
        if p.requires_grad:
            kinds.setdefault((p.dim() >= 2, layer_lr_scale(name, model, t.layer_decay)), []).append(p)
    order = sorted(kinds, key=lambda kind: (not kind[0], kind[1]))  # decayed matrices first, slowest first
    groups = [
        {"params": kinds[kind], "weight_decay": t.weight_decay if kind[0] else 0.0, "lr": kind[1]}
        for kind in order
    ]
    fused = device.type in FUSED_ADAMW_DEVICES
    return torch.optim.AdamW(groups, lr=1.0, betas=tuple(t.betas), eps=t.eps, fused=fused)


class Trainer:
    """One training run in ``run_dir``; ``fit()`` runs it and returns the final validation scores.

    The trainer is handed its task: ``task`` makes it from the run config, the tokenizer (a resumed
    run's, a pretrained model's, or None to learn one) and ``echo``. By default it is the task that
    ``data.task`` names (``attnkit.tasks.make_task``); any object with the protocol of
    ``attnkit.tasks.protocol.Task`` trains the same way, e.g. a task subclass with another loss."""

    def __init__(
        self,
        config: RunConfig,
        run_dir: str | Path,
        *,
        resume: bool = False,
        overwrite: bool = False,
        echo: Callable = print,
        command: str = "attnkit train",
        task: TaskFactory = make_task,
    ):
        if resume and overwrite:
            raise AttnkitError("resume and overwrite exclude each other: continue a run or replace it")
        config = _ready_to_train(config)
        t = config.train
        self.config, self.run_dir, self.echo = config, Path(run_dir), echo
        self.command = command  # recorded in each checkpoint as what made it (folders.py)
        self.make_task = task  # the run's task is made from its config and tokenizer (_prepared_task)
        self.device = resolve_device(t.device)
        self.world = init_world(self.device.type)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", self.world.local_rank)
        self.autocast_dtype, precision = training_precision(t.precision, self.device)
        t.precision = "fp32" if self.autocast_dtype is None else "bf16"  # what config.json records
        # before anything reads or deletes the directory; a --resume of no directory fails below instead
        locks = self.world.is_main and (not resume or self.run_dir.is_dir())
        self.lock = lock_run(self.run_dir) if locks else None
        try:
            self._say(f"precision: {precision}")
            resume_from, pretrained = self._starting_point(config, resume)
            self._prepare_run_dir(replace=not resume, overwrite=overwrite)
            torch.manual_seed(t.seed)  # the same initial weights in every process
            self.task = self._prepared_task(config, resume_from, pretrained)
            self.tokenizer = self.task.tokenizer
            self.sharded = t.parallel == "fsdp" and self.world.size > 1  # else one process holds it all
            self.model = self._placed_model(config, resume_from, pretrained)
            torch.manual_seed(t.seed + 1_000_003 * (self.world.rank + 1))  # dropout: a stream per process
            self.optimizer = make_optimizer(self.model, t, self.device)
            decay_steps = t.decay_steps or t.max_steps
            rate = learning_rate_fn(t.schedule, t.lr, t.warmup, config.model.d_model, decay_steps, t.min_lr)
            self.scheduler = make_scheduler(self.optimizer, rate)
            # Where the run is: moved by fit(), saved in every checkpoint, restored by a resumed run.
            self.step, self.epoch, self.position, self.elapsed = 0, 0, 0, 0.0
            self.best, self.bad_evals, self.history, self.scores = None, 0, [], {}
            if resume_from:
                self._restore(resume_from)
            self.ddp = self._data_parallel()  # the model as the training step runs it
        except BaseException:
            self._let_go()
            raise
        # What fit() measures as it goes (set again when it starts).
        self.started, self.pace, self.out_of_time = 0.0, (self.step, 0.0), False
        self.window = _new_window()  # training statistics since the last validation
        self.grad_norm: float | None = None  # the last step's, when it was measured (_train_step)
        self.board: TensorBoardLog | None = None  # TensorBoard's events (train.log), in the saving process

    def _starting_point(self, config: RunConfig, resume: bool) -> tuple[Path | None, Pretrained | None]:
        """The checkpoint a resumed run continues from, or the pretrained model a new one starts from
        (``train.init_from``; its shape replaces ``config.model``'s), or neither."""
        resume_from = resolve_checkpoint(self.run_dir, prefer="last") if resume else None
        if resume_from:
            _check_resumable(read_run_config(resume_from), config)
            return resume_from, None
        pretrained = read_pretrained(config.train.init_from) if config.train.init_from else None
        if pretrained:
            config.model = pretrained.shape_for(config.model)
        return None, pretrained

    def _prepared_task(
        self, config: RunConfig, resume_from: Path | None, pretrained: Pretrained | None
    ) -> Task:
        """The run's task, its data prepared, with the tokenizer of the run resumed or the model
        fine-tuned (None: the task learns one)."""
        tokenizer = read_tokenizer(resume_from, config) if resume_from else None
        if pretrained:
            tokenizer = pretrained.tokenizer
        # One process prepares the data first (a token store is built once: data/store.py) and the
        # others then find what it left, instead of all building the same store at the same time.
        return self.world.in_turns(lambda: self.make_task(config, tokenizer, self._say))

    def _placed_model(self, config: RunConfig, resume_from: Path | None, pretrained: Pretrained | None):
        """The model with its starting weights, frozen parts frozen, on the device: sharded over the
        processes (``train.parallel=fsdp``), or whole with the CPU fast path."""
        model = build_for_tokenizer(config, self.tokenizer)
        if pretrained:
            pretrained.load_into(model, self._say)
        if resume_from:  # whole weights, before FSDP shards them (any format, any number of processes)
            load_model_weights(model, resume_from)
        frozen = config.train.freeze
        if frozen:
            self._say(f"frozen: {freeze(model, frozen):,} parameters ({', '.join(frozen)})")
        if self.sharded:  # moves each layer's shards to the device: the whole model never is on it
            fully_shard_model(model, self.world, self.device, self.autocast_dtype)
        else:
            model.to(self.device)
            speed_up(model)  # on a CPU, the same arithmetic faster (attnkit.cpu); elsewhere nothing
        return model

    def _data_parallel(self) -> torch.nn.Module:
        """The model wrapped in DDP when several processes each hold it whole; the model itself when
        one process trains or FSDP shards it."""
        if self.world.size == 1 or self.sharded:
            return self.model
        return DistributedDataParallel(
            self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
        )

    def _let_go(self) -> None:
        """Release the run directory (:func:`attnkit.checkpoint.run_dir.lock_run`) for the next run."""
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    def _say(self, message: str) -> None:
        if self.world.is_main:
            self.echo(message)

    def _prepare_run_dir(self, replace: bool, overwrite: bool) -> None:
        """A new run needs a directory without an earlier run (or deletes it, with ``overwrite``); any
        run needs one it can write to, which is checked now rather than at the first checkpoint."""
        earlier = earlier_run(self.run_dir) if replace else []
        if earlier and not overwrite:
            names = ", ".join(p.name for p in earlier[:4]) + (", ..." if len(earlier) > 4 else "")
            raise AttnkitError(
                f"{self.run_dir} already holds a run ({names}): continue it with --resume, choose another "
                "run directory, or pass --overwrite to delete its checkpoints first"
            )
        if not self.world.is_main:
            return
        if earlier:
            clear_run(self.run_dir)
            self._say(f"overwrite: deleted the earlier run in {self.run_dir} ({len(earlier)} entries)")
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.run_dir):
                pass
        except OSError as error:
            raise AttnkitError(
                f"{self.run_dir}: cannot write checkpoints there ({error.strerror or error})"
            ) from None

    # --- the loop -------------------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        """Train until a limit (steps, epochs, minutes) or early stopping; returns the last validation."""
        t = self.config.train
        self.started = time.perf_counter() - self.elapsed
        self.out_of_time = self._past_budget()  # from the restored elapsed time: the same in every process
        self.pace = (self.step, time.perf_counter())  # where this process began: for the time left
        show_bar = self.world.is_main and sys.stderr.isatty()  # no bar in log files; validations still print
        bar = tqdm(total=t.max_steps or None, initial=self.step, disable=not show_bar, unit="step",
                   dynamic_ncols=True, leave=False)  # fmt: skip
        self.window = _new_window()
        if self._finished():
            self._say(
                f"nothing to train: the run is at step {self.step} (epoch {self.epoch}), where its "
                "limits end it; raise train.max_steps, max_epochs or max_minutes to go on"
            )
        if "tensorboard" in t.log and self.world.is_main:
            self.board = TensorBoardLog(self.run_dir / "tensorboard", first_step=self.step + 1)
        try:
            stopped_early, first_step = False, self.step
            while not stopped_early and not self._finished():
                stopped_early = self._train_epoch(bar, show_bar)
            unsaved = self.step != first_step and self.step % t.eval_every != 0  # steps since the last save
            if not stopped_early and unsaved:
                self._evaluate_and_save()
            self.world.barrier()  # all processes end together: gloo aborts if one leaves while another works
            return self.scores
        finally:
            bar.close()
            if self.board is not None:
                self.board.close()
            self.ddp = self.model  # DDP's reducer holds the process group: let go, so close_world ends it
            close_world(self.world)
            self._let_go()

    def _train_epoch(self, bar: tqdm, show_bar: bool) -> bool:
        """Continue the current epoch from ``self.position``; True when early stopping ends training."""
        t = self.config.train
        batches = self.task.epoch_batches(self.epoch)
        if len(batches) < self.world.size:  # no step could ever be taken: say so instead of looping
            raise AttnkitError(
                f"the training data makes {len(batches)} batch(es) of at most "
                f"train.max_tokens={t.max_tokens} tokens, fewer than the {self.world.size} processes: "
                "lower train.max_tokens or start fewer"
            )
        per_step = t.update_freq * self.world.size
        while self.position < len(batches) and not self._finished():
            group = batches[self.position : self.position + per_step]
            if len(group) < self.world.size:  # too few left for every rank: an idle rank would hang
                break
            loss, nll, tokens = self._train_step(shard(group, self.world))
            self.step, self.position = self.step + 1, self.position + per_step
            for key, value in (("loss", loss), ("nll", nll), ("tokens", tokens)):
                self.window[key] += value
            self.elapsed = time.perf_counter() - self.started
            self._report_progress(bar, show_bar, loss / tokens)
            if self.step % t.eval_every == 0:
                self._evaluate_and_save()
                if t.patience and self.bad_evals >= t.patience:
                    self._say(f"stopping early: no improvement in {t.patience} validations")
                    return True
        if self.position >= len(batches) or len(batches[self.position :]) < self.world.size:
            self.epoch, self.position = self.epoch + 1, 0
        return False

    def _report_progress(self, bar: tqdm, show_bar: bool, loss: float) -> None:
        """The bar's loss, lr and tokens/s; without a terminal, a line every ``log_every`` steps instead
        (with the gradient norm and the time left); and TensorBoard's training points every ``log_every``."""
        lr = max(self.scheduler.get_last_lr())  # the full rate (train.layer_decay slows lower layers)
        speed = self.window["tokens"] / max(time.perf_counter() - self.window["began"], 1e-9)
        due = self._logs(self.step)
        if due and self.board is not None:
            self.board.add(self.step, {"train/loss": loss, "train/lr": lr, "train/tokens_per_s": speed,
                                       "train/grad_norm": self.grad_norm})  # fmt: skip
        if show_bar:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", per_s=f"{speed:,.0f}")
        elif due:
            norm = f", gradient norm {self.grad_norm:.3g}" if self.grad_norm is not None else ""
            self._say(
                f"step {self.step}: loss {loss:.3f}, lr {lr:.2e}{norm}, {speed:,.0f} {self.task.unit}/s"
                + self._time_left()
            )

    def _logs(self, step: int) -> bool:
        """Whether step ``step`` is one that ``train.log_every`` reports."""
        every = self.config.train.log_every
        return bool(every and step % every == 0)

    def _time_left(self) -> str:
        """``", about 1:05 left"`` with ``train.max_steps``, at this process's pace so far (else "")."""
        first_step, began = self.pace
        done, limit = self.step - first_step, self.config.train.max_steps
        if not limit or done <= 0:
            return ""
        seconds = round((limit - self.step) * (time.perf_counter() - began) / done)
        return f", about {seconds // 60}:{seconds % 60:02d} left"

    def _past_budget(self) -> bool:
        """Whether this process's clock has passed ``train.max_minutes``."""
        t = self.config.train
        return bool(t.max_minutes and time.perf_counter() - self.started >= t.max_minutes * 60)

    def _finished(self) -> bool:
        """A limit is reached; ``out_of_time`` is agreed by all processes once per step (``_train_step``)."""
        t = self.config.train
        enough_steps = bool(t.max_steps and self.step >= t.max_steps)
        return enough_steps or bool(t.max_epochs and self.epoch >= t.max_epochs) or self.out_of_time

    def _train_step(self, batches: list[Any]) -> tuple[float, float, float]:
        """One optimizer update over this rank's batches; returns global (loss, nll, tokens) sums."""
        self.ddp.train()
        self.optimizer.zero_grad(set_to_none=True)
        made = [self.task.make_batch(b) for b in batches]
        local_tokens = sum(b.n_tokens for b in made)
        (global_tokens,) = self.world.all_sum([float(local_tokens)], self.device)
        sums = torch.zeros(2, device=self.device)  # (loss, nll) summed on the device, read once per step
        for k, batch in enumerate(made):
            batch = batch.to(self.device)
            sync = k == len(made) - 1 or self.world.size == 1
            with self._syncing(sync), self._autocast():
                loss, nll = self.task.loss(self.ddp, batch)
            # DDP and FSDP average gradients over ranks; scaling by world size makes that a sum over tokens.
            (loss * self.world.size / global_tokens).backward()
            sums += torch.stack([loss.detach(), nll])  # no .item() per batch: a GPU need not wait
        # One collective per step: the sums, and whether any process's clock passed the budget (clocks
        # differ; all processes must stop at the same step).
        loss_sum, nll_sum, late = self.world.all_sum(
            [*sums.tolist(), float(self._past_budget())], self.device
        )
        self.out_of_time = late > 0
        if not math.isfinite(loss_sum):
            raise AttnkitError(
                f"loss became {loss_sum} at step {self.step + 1}; lower train.lr or add train.clip_norm"
            )
        clip = self.config.train.clip_norm
        if clip > 0 or self._logs(self.step + 1):  # the norm is measured when clipping or reporting it
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else math.inf)
            self.grad_norm = float(norm)
        self.optimizer.step()
        self.scheduler.step()
        return loss_sum, nll_sum, global_tokens

    def _syncing(self, sync: bool):
        """A context for one batch's backward: whether it combines the gradients of all processes
        (the step's last batch) or only accumulates this process's (gradient accumulation)."""
        if self.sharded:
            self.model.set_requires_gradient_sync(sync)
            return nullcontext()
        return nullcontext() if sync else self.ddp.no_sync()

    def _autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    # --- validation and checkpoints ---------------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """The task's validation scores (loss and perplexity, and e.g. BLEU for translation)."""
        self.model.eval()
        with whole_root(self.model):
            return self.task.validate(self.model, self.device, self._autocast)

    def _evaluate_and_save(self) -> None:
        """Validate, log, save a checkpoint (best or not), and start a new window of training statistics."""
        window = self.window
        train_seconds = max(time.perf_counter() - window["began"], 1e-9)  # before validation's time
        scores = self.scores = self.validate()
        metric = self.config.train.eval_metric
        value = scores[self.task.metrics[metric]] * (-1 if metric in LOWER_IS_BETTER else 1)  # higher: better
        is_best = self.best is None or value > self.best
        self.best, self.bad_evals = (value, 0) if is_best else (self.best, self.bad_evals + 1)
        tokens = max(window["tokens"], 1.0)
        row = {"step": self.step, "epoch": self.epoch, "lr": max(self.scheduler.get_last_lr()),
               "train_loss": window["loss"] / tokens, "train_ppl": perplexity(window["nll"] / tokens),
               "tokens_per_s": window["tokens"] / train_seconds,
               **scores, "elapsed_s": self.elapsed}  # fmt: skip
        self.history.append(row)
        if self.board is not None:
            self.board.add(self.step, {**{f"valid/{k.removeprefix('valid_')}": v for k, v in scores.items()},
                                       **memory_used(self.device)})  # fmt: skip
        shown = ", ".join(f"{name.removeprefix('valid_')} {value:.4g}" for name, value in scores.items())
        self._say(
            f"step {self.step} epoch {self.epoch}: train loss {row['train_loss']:.3f}, valid {shown}"
            + ("  (best)" if is_best else "")
        )
        rng = self.world.all_gather(rng_state())  # every process's, so each resumes its own stream
        self._save(is_best, rng)
        if self.world.is_main:
            self._write_log()
        self.window = _new_window()  # started after validation and saving: they are not training time

    def _save(self, is_best: bool, rng: list) -> None:
        """Write a checkpoint: the first process writes it (in a sharded run, after every process has
        written its shards of the model and the optimizer there)."""
        if not (self.world.is_main or self.sharded):
            return
        state = {"step": self.step, "epoch": self.epoch, "position": self.position, "elapsed": self.elapsed,
                 "best": self.best, "bad_evals": self.bad_evals, "history": self.history,
                 "scheduler": self.scheduler.state_dict()}  # fmt: skip
        save_checkpoint(
            self.run_dir, self.step, model=self.model, config=self.config.to_dict(),
            tokenizer_json=self.tokenizer and self.tokenizer.to_str(), optimizer=self.optimizer,
            trainer_state=state, rng=rng, is_best=is_best, keep_last=self.config.train.keep_last,
            command=self.command, shard_over=self.world if self.sharded else None,
        )  # fmt: skip

    def _restore(self, checkpoint: Path) -> None:
        """The training state of ``checkpoint`` (its weights are loaded before the model is sharded)."""
        state = load_trainer_state(checkpoint, self.optimizer, self.world.rank)
        self.step, self.epoch, self.position = state["step"], state["epoch"], state["position"]
        self.elapsed, self.best, self.bad_evals = state["elapsed"], state["best"], state["bad_evals"]
        self.history = state["history"]
        self.scheduler.load_state_dict(state["scheduler"])
        self._say(
            f"resumed from {checkpoint} at step {self.step} (epoch {self.epoch}, batch {self.position})"
        )
        if state["world_size"] != self.world.size:
            self._say(
                f"note: saved by {state['world_size']} process(es) and resumed with {self.world.size}: "
                "training continues, but not bit for bit as the uninterrupted run would"
            )

    def _write_log(self) -> None:
        """metrics.csv, rewritten whole from the history (so a resumed run has no stale rows): the
        training statistics, then the task's validation scores, then the elapsed time."""
        scores = [k for k in self.history[0] if k not in LOG_FIELDS and k != "elapsed_s"]
        fields = [*LOG_FIELDS, *scores, "elapsed_s"]
        text_rows = [{k: row.get(k, "") for k in fields} for row in self.history]
        with atomic_writer(self.run_dir / "metrics.csv") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(text_rows)
