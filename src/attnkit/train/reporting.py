"""What a run tells as it goes: at a terminal a progress bar (loss, learning rate, tokens/s), else a
line every ``train.log_every`` steps with the gradient norm and the time left; TensorBoard's points
(``train.log``); a line for each validation; and ``metrics.csv``, a row per validation, rewritten whole
each time from the run's history (so a resumed run has no stale rows)."""

from __future__ import annotations

import csv
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from attnkit.atomic import atomic_writer
from attnkit.checkpoint.trainer_state import TrainerState
from attnkit.config import TrainConfig
from attnkit.metrics import perplexity
from attnkit.train.tensorboard import TensorBoardLog, memory_used

LOG_FIELDS = ["step", "epoch", "lr", "train_loss", "train_ppl", "tokens_per_s"]  # then the task's scores


class Reporter:
    """The run's reports, from the process that saves (the others' ``say`` says nothing). Between two
    validations it sums the training statistics (loss, nll, tokens) of the steps taken, the window
    that a validation's row reports; ``unit`` names what tokens/s counts (the task's)."""

    def __init__(
        self, train: TrainConfig, run_dir: Path, say: Callable[[str], None], unit: str, main: bool,
        device: torch.device,
    ):  # fmt: skip
        self.train, self.run_dir, self.say, self.unit, self.main = train, run_dir, say, unit, main
        self.device = device  # whose memory TensorBoard hears of at each validation
        self.show_bar = main and sys.stderr.isatty()  # no bar in log files; validations still print
        self.bar: tqdm | None = None
        self.board: TensorBoardLog | None = None  # TensorBoard's events, in the saving process
        self.pace = (0, 0.0)  # (step, time) where this process began: for the time left
        self.window = self._new_window()

    def start(self, step: int) -> None:
        """The run goes on from ``step``: the bar, TensorBoard's log and a new window."""
        self.pace = (step, time.perf_counter())
        self.bar = tqdm(total=self.train.max_steps or None, initial=step, disable=not self.show_bar,
                        unit="step", dynamic_ncols=True, leave=False)  # fmt: skip
        if "tensorboard" in self.train.log and self.main:
            self.board = TensorBoardLog(self.run_dir / "tensorboard", first_step=step + 1)
        self.window = self._new_window()

    def due(self, step: int) -> bool:
        """Whether step ``step`` is one that ``train.log_every`` reports."""
        every = self.train.log_every
        return bool(every and step % every == 0)

    def trained(
        self, step: int, sums: tuple[float, float, float], lr: float, grad_norm: float | None
    ) -> None:
        """Step ``step`` took ``sums`` (loss, nll, tokens, over every process) at learning rate ``lr``."""
        for key, value in zip(("loss", "nll", "tokens"), sums, strict=True):
            self.window[key] += value
        loss = sums[0] / sums[2]
        speed = self.window["tokens"] / self.training_seconds()
        due = self.due(step)
        if due and self.board is not None:
            self.board.add(step, {"train/loss": loss, "train/lr": lr, "train/tokens_per_s": speed,
                                  "train/grad_norm": grad_norm})  # fmt: skip
        if self.show_bar and self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", per_s=f"{speed:,.0f}")
        elif due:
            norm = f", gradient norm {grad_norm:.3g}" if grad_norm is not None else ""
            self.say(f"step {step}: loss {loss:.3f}, lr {lr:.2e}{norm}, {speed:,.0f} {self.unit}/s"
                     + self._time_left(step))  # fmt: skip

    def training_seconds(self) -> float:
        """Seconds since the window began (taken before a validation: it is not training time)."""
        return max(time.perf_counter() - self.window["began"], 1e-9)

    def validated(
        self, state: TrainerState, lr: float, scores: dict[str, float], seconds: float, best: bool
    ) -> dict[str, Any]:
        """A validation where the run is now (``state``, at learning rate ``lr``) gave ``scores`` after
        ``seconds`` of training: its row of metrics.csv, told as a line (and to TensorBoard)."""
        window, tokens = self.window, max(self.window["tokens"], 1.0)
        row = {"step": state.step, "epoch": state.epoch, "lr": lr,
               "train_loss": window["loss"] / tokens, "train_ppl": perplexity(window["nll"] / tokens),
               "tokens_per_s": window["tokens"] / seconds, **scores,
               "elapsed_s": state.elapsed}  # fmt: skip
        if self.board is not None:
            shown = {f"valid/{name.removeprefix('valid_')}": value for name, value in scores.items()}
            self.board.add(state.step, {**shown, **memory_used(self.device)})
        shown = ", ".join(f"{name.removeprefix('valid_')} {value:.4g}" for name, value in scores.items())
        self.say(f"step {state.step} epoch {state.epoch}: train loss {row['train_loss']:.3f}, valid {shown}"
                 + ("  (best)" if best else ""))  # fmt: skip
        return row

    def begin_window(self) -> None:
        """A new window of training statistics (after a validation and its checkpoint)."""
        self.window = self._new_window()

    def write_log(self, history: list[dict[str, Any]]) -> None:
        """metrics.csv from the run's ``history``: the training statistics, then the task's validation
        scores, then the elapsed time."""
        scores = [k for k in history[0] if k not in LOG_FIELDS and k != "elapsed_s"]
        fields = [*LOG_FIELDS, *scores, "elapsed_s"]
        with atomic_writer(self.run_dir / "metrics.csv") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows([{k: row.get(k, "") for k in fields} for row in history])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.board is not None:
            self.board.close()

    def _time_left(self, step: int) -> str:
        """``", about 1:05 left"`` with ``train.max_steps``, at this process's pace so far (else "")."""
        first_step, began = self.pace
        done, limit = step - first_step, self.train.max_steps
        if not limit or done <= 0:
            return ""
        seconds = round((limit - step) * (time.perf_counter() - began) / done)
        return f", about {seconds // 60}:{seconds % 60:02d} left"

    @staticmethod
    def _new_window() -> dict[str, float]:
        """Running sums of training statistics between two validations."""
        return {"loss": 0.0, "nll": 0.0, "tokens": 0.0, "began": time.perf_counter()}
