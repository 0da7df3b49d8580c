"""The training loop: read it top to bottom, no callbacks.

``Trainer(config, run_dir).fit()`` prepares the data, builds the model and Adam(β1=0.9, β2=0.98,
ε=1e-9) with the chosen schedule (§5.3), then repeats: take ``update_freq`` token-budget batches,
accumulate the label-smoothed loss, clip, step; every ``eval_every`` steps validate (loss, perplexity,
greedy BLEU and exact match), save a checkpoint (atomically; ``best`` by ``eval_metric``) and maybe stop
early. ``resume=True`` restores weights, optimizer, schedule, RNG states and the position in the epoch
(the :class:`TrainerState`) from the run's ``last`` checkpoint, so the continued run is the run that
was interrupted. The config's checks (checks.py), the optimizer (optimizer.py) and what the run tells
as it goes (reporting.py) live beside it.

A new run refuses a run directory that already holds a run, so that two runs' checkpoints never mix
(``overwrite=True`` deletes the earlier one's first). With several processes (torchrun) every process
starts from the same weights but draws dropout from its own seed, and every process's RNG state is
saved and restored: a resumed multi-process run is the uninterrupted one too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from attnkit.checkpoint.folder import (
    CheckpointContents,
    load_model_weights,
    resolve_checkpoint,
    save_checkpoint,
)
from attnkit.checkpoint.run_dir import lock_run, prepare_run_dir
from attnkit.checkpoint.trainer_state import TrainerState, load_trainer_state, rng_state
from attnkit.config import LOWER_IS_BETTER, RunConfig
from attnkit.cpu import speed_up
from attnkit.decode.starts import kernels_chosen_by_training
from attnkit.errors import AttnkitError
from attnkit.loading import build_for_tokenizer, read_tokenizer
from attnkit.processes import close_world, init_world, resolve_device
from attnkit.task_records import task_record
from attnkit.tasks import make_task
from attnkit.tasks.protocol import TaskFactory
from attnkit.train.checks import ready_to_train
from attnkit.train.distributed import fully_shard_model, shard, whole_root
from attnkit.train.optimizer import freeze, make_optimizer
from attnkit.train.precision import autocast_for, faster_of_two, measured_on, training_precision
from attnkit.train.pretrained import Pretrained
from attnkit.train.reporting import Reporter
from attnkit.train.schedules import learning_rate_fn, make_scheduler


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
        self.run_dir = Path(run_dir)
        resume_from = resolve_checkpoint(self.run_dir, prefer="last") if resume else None
        config, pretrained = ready_to_train(config, resume_from)  # a copy: the caller's stays as it was
        t = config.train
        self.config, self.echo = config, echo
        self.command = command  # recorded in each checkpoint as what made it (folders.py)
        self.make_task = task  # the run's task is made from its config and tokenizer
        self.device = resolve_device(t.device)
        self.world = init_world(self.device.type)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", self.world.local_rank)
        dtype, precision = training_precision(t.precision, self.device)
        measure = measured_on(t.precision, self.device, dtype, self.world.size)
        self._train_in(dtype)
        self.lock = lock_run(self.run_dir) if self.world.is_main else None  # before it is read or deleted
        try:
            self._say(
                f"precision: {precision}" + (", unless float32 trains this model faster" if measure else "")
            )
            prepare_run_dir(self.run_dir, not resume, overwrite, self.world.is_main, self._say)
            torch.manual_seed(t.seed)  # the same initial weights in every process
            # The tokenizer of the run resumed or of the model fine-tuned; None: the task learns one.
            tokenizer = read_tokenizer(resume_from, config) if resume_from else None
            if pretrained:
                tokenizer = pretrained.tokenizer
            # One process prepares the data first (a token store is built once: data/store.py) and the
            # others then find what it left, instead of all building the same store at the same time.
            self.task = self.world.in_turns(lambda: self.make_task(config, tokenizer, self._say))
            self.tokenizer = self.task.tokenizer
            self.sharded = t.parallel == "fsdp" and self.world.size > 1  # else one process holds it all
            self.model, self.ddp = self._placed_model(config, resume_from, pretrained)
            self.first_batches: list[Any] | None = None  # epoch 0's, where the timing below made them
            if measure:
                self._choose_precision_by_timing()
            torch.manual_seed(t.seed + 1_000_003 * (self.world.rank + 1))  # dropout: a stream per process
            self.optimizer = make_optimizer(self.model, t, self.device)
            decay_steps = t.decay_steps or t.max_steps
            rate = learning_rate_fn(t.schedule, t.lr, t.warmup, config.model.d_model, decay_steps, t.min_lr)
            self.scheduler = make_scheduler(self.optimizer, rate)
            self.state, self.scores = TrainerState(), {}  # where the run is; its last validation's scores
            if resume_from:
                self._restore(resume_from)
        except BaseException:
            self._let_go()
            raise
        # What fit() measures as it goes (set again when it starts).
        self.started, self.out_of_time = 0.0, False
        self.grad_norm: float | None = None  # the last step's, when it was measured (_train_step)
        self.report = Reporter(t, self.run_dir, self._say, self.task.unit, self.world.is_main, self.device)

    def _placed_model(
        self, config: RunConfig, resume_from: Path | None, pretrained: Pretrained | None
    ) -> tuple[torch.nn.Module, torch.nn.Module]:
        """The model with its starting weights, frozen parts frozen, on the device: sharded over the
        processes (``train.parallel=fsdp``), or whole with the CPU fast path; and the model as the
        training step runs it (wrapped in DDP where several processes each hold it whole)."""
        model = build_for_tokenizer(config, self.tokenizer)
        if pretrained:
            pretrained.load_into(model, self._say)
        if resume_from:  # whole weights, before FSDP shards them (any format, any number of processes)
            load_model_weights(model, resume_from)
        frozen = config.train.freeze
        if frozen:
            self._say(f"frozen: {freeze(model, frozen):,} parameters ({', '.join(frozen)})")
        kernels_chosen_by_training(model)  # validation's searches keep them (decode/starts.py)
        if self.sharded:  # moves each layer's shards to the device: the whole model never is on it
            fully_shard_model(model, self.world, self.device, self.autocast_dtype)
            return model, model
        model.to(self.device)
        speed_up(model)  # on a CPU, the same arithmetic faster (attnkit.cpu); elsewhere nothing
        if self.world.size == 1:
            return model, model
        # DDP hands every process rank 0's weights as it wraps them: the same start everywhere.
        return model, DistributedDataParallel(
            model, device_ids=[self.device.index] if self.device.type == "cuda" else None
        )

    def _choose_precision_by_timing(self) -> None:
        """``train.precision=auto`` on a CPU with bf16 units: bf16 or float32, whichever trains the first
        batch faster (train/precision.py). The run goes on as if it had been told the precision chosen:
        the steps timed leave no gradients, and the model's buffers as they were (the dropout's
        generator is seeded afterwards)."""
        batches = self.first_batches = self.task.epoch_batches(0)  # (the loop takes them: made once)
        if not batches:
            return  # (the loop says why no step can be taken)
        batch = self.task.make_batch(batches[0]).to(self.device)
        buffers = [buffer.clone() for buffer in self.model.buffers()]

        def step(autocast: Callable[[], AbstractContextManager]) -> None:
            with autocast():
                loss, _ = self.task.loss(self.ddp, batch)
            loss.backward()

        self.ddp.train()
        dtype, precision = faster_of_two(step)
        self._train_in(dtype)
        self.model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for kept, buffer in zip(buffers, self.model.buffers(), strict=True):
                buffer.copy_(kept)
        self._say(f"precision: {precision}")

    def _train_in(self, dtype: torch.dtype | None) -> None:
        """Train with autocast to ``dtype`` (None: float32 throughout), and record it in config.json."""
        self.autocast_dtype = dtype
        self.autocast = autocast_for(self.device, dtype)  # every forward pass runs in it
        self.config.train.precision = "fp32" if dtype is None else "bf16"

    def _let_go(self) -> None:
        """Release the run directory (:func:`attnkit.checkpoint.run_dir.lock_run`) for the next run."""
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    def _say(self, message: str) -> None:
        if self.world.is_main:
            self.echo(message)

    # --- the loop -------------------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        """Train until a limit (steps, epochs, minutes) or early stopping; returns the last validation."""
        t, state = self.config.train, self.state
        self.started = time.perf_counter() - state.elapsed
        self.out_of_time = self._past_budget()  # from the restored elapsed time: the same in every process
        self.report.start(state.step)
        if self._finished():
            self._say(
                f"nothing to train: the run is at step {state.step} (epoch {state.epoch}), where its "
                "limits end it; raise train.max_steps, max_epochs or max_minutes to go on"
            )
        try:
            stopped_early, first_step = False, state.step
            while not stopped_early and not self._finished():
                stopped_early = self._train_epoch()
            unsaved = state.step != first_step and state.step % t.eval_every != 0  # since the last save
            if not stopped_early and unsaved:
                self._evaluate_and_save()
            self.world.barrier()  # all processes end together: gloo aborts if one leaves while another works
            return self.scores
        finally:
            self.report.close()
            self.ddp = self.model  # DDP's reducer holds the process group: let go, so close_world ends it
            close_world(self.world)
            self._let_go()

    def _train_epoch(self) -> bool:
        """Continue the current epoch from ``state.position``; True when early stopping ends training."""
        t, state = self.config.train, self.state
        batches, self.first_batches = self.first_batches, None
        if batches is None or state.epoch != 0:  # (epoch 0's, made for the precision's timing, once)
            batches = self.task.epoch_batches(state.epoch)
        if len(batches) < self.world.size:  # no step could ever be taken: say so instead of looping
            raise AttnkitError(
                f"the training data makes {len(batches)} batch(es) of at most "
                f"train.max_tokens={t.max_tokens} tokens, fewer than the {self.world.size} processes: "
                "lower train.max_tokens or start fewer"
            )
        per_step = t.update_freq * self.world.size
        while state.position < len(batches) and not self._finished():
            group = batches[state.position : state.position + per_step]
            if len(group) < self.world.size:  # too few left for every rank: an idle rank would hang
                break
            sums = self._train_step(shard(group, self.world))
            state.step, state.position = state.step + 1, state.position + per_step
            state.elapsed = time.perf_counter() - self.started
            lr = max(self.scheduler.get_last_lr())  # the full rate (train.layer_decay slows lower layers)
            self.report.trained(state.step, sums, lr, self.grad_norm)
            if state.step % t.eval_every == 0:
                self._evaluate_and_save()
                if t.patience and state.bad_evals >= t.patience:
                    self._say(f"stopping early: no improvement in {t.patience} validations")
                    return True
        if state.position >= len(batches) or len(batches[state.position :]) < self.world.size:
            state.epoch, state.position = state.epoch + 1, 0
        return False

    def _past_budget(self) -> bool:
        """Whether this process's clock has passed ``train.max_minutes``."""
        t = self.config.train
        return bool(t.max_minutes and time.perf_counter() - self.started >= t.max_minutes * 60)

    def _finished(self) -> bool:
        """A limit is reached; ``out_of_time`` is agreed by all processes once per step (``_train_step``)."""
        t = self.config.train
        enough_steps = bool(t.max_steps and self.state.step >= t.max_steps)
        return enough_steps or bool(t.max_epochs and self.state.epoch >= t.max_epochs) or self.out_of_time

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
            with self._syncing(sync), self.autocast():
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
                f"loss became {loss_sum} at step {self.state.step + 1}; lower train.lr or add train.clip_norm"
            )
        clip = self.config.train.clip_norm
        if clip > 0 or self.report.due(
            self.state.step + 1
        ):  # the norm is measured when clipping or reporting it
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

    # --- validation and checkpoints ---------------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """The task's validation scores (loss and perplexity, and e.g. BLEU for translation)."""
        self.model.eval()
        with whole_root(self.model):
            return self.task.validate(self.model, self.device, self.autocast)

    def _evaluate_and_save(self) -> None:
        """Validate, log, save a checkpoint (best or not), and start a new window of training statistics."""
        state, metric = self.state, self.config.train.eval_metric
        seconds = self.report.training_seconds()  # before validation's time
        scores = self.scores = self.validate()
        score = scores[task_record(self.config.data.task).metrics[metric]]
        value = score * (-1 if metric in LOWER_IS_BETTER else 1)  # higher: better
        is_best = state.best is None or value > state.best
        state.best, state.bad_evals = (value, 0) if is_best else (state.best, state.bad_evals + 1)
        lr = max(self.scheduler.get_last_lr())
        state.history.append(self.report.validated(state, lr, scores, seconds, is_best))
        rng = self.world.all_gather(rng_state())  # every process's, so each resumes its own stream
        self._save(is_best, rng)
        if self.world.is_main:
            self.report.write_log(state.history)
        self.report.begin_window()  # after validation and saving: they are not training time

    def _save(self, is_best: bool, rng: list) -> None:
        """Write a checkpoint: the first process writes it (in a sharded run, after every process has
        written its shards of the model and the optimizer there)."""
        if not (self.world.is_main or self.sharded):
            return
        self.state.scheduler = self.scheduler.state_dict()
        tokenizer = self.tokenizer and self.tokenizer.to_str()
        contents = CheckpointContents(self.model, self.config.to_dict(), tokenizer, self.optimizer,
                                      self.state, rng, self.command)  # fmt: skip
        shard_over = self.world if self.sharded else None
        save_checkpoint(self.run_dir, self.state.step, contents, is_best=is_best,
                        keep_last=self.config.train.keep_last, shard_over=shard_over)  # fmt: skip

    def _restore(self, checkpoint: Path) -> None:
        """The training state of ``checkpoint`` (its weights are loaded before the model is sharded)."""
        state, saved_by = load_trainer_state(checkpoint, self.optimizer, self.world.rank)
        self.state = state
        self.scheduler.load_state_dict(state.scheduler)
        self._say(
            f"resumed from {checkpoint} at step {state.step} (epoch {state.epoch}, batch {state.position})"
        )
        if saved_by != self.world.size:
            self._say(
                f"note: saved by {saved_by} process(es) and resumed with {self.world.size}: "
                "training continues, but not bit for bit as the uninterrupted run would"
            )
