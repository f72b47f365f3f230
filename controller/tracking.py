"""Metric sinks for the controller: console, JSONL and TensorBoard, plus wandb / mlflow
(controller/trackers.py, optional extras).

``Tracking.log(metrics, step)`` fans one dict of scalars out to every enabled
sink. Keys are verl's names (``actor/pg_loss``, ``critic/score/mean``,
``timing_s/step`` ...); this file does not invent or rename keys, it only picks
a few of them for the one-line console summary (``CONSOLE_METRICS``).

- ``jsonl``: one ``{"step": step, **metrics}`` line per step in
  ``run_dir/metrics.jsonl``, flushed immediately so a crashed run keeps every
  logged step (and a resumed run appends to the same file). A later call for a
  step that has its line (the final validation after the last step, a restart
  counted at the step the run went back to) is merged into that line (the file
  is rewritten, rarely). ``rewind(step)`` (a run gone back to a checkpoint) drops
  the lines of later steps; TensorBoard hides their events (``purge_step``).
- ``tensorboard``: scalars under ``run_dir/tensorboard`` (torch's SummaryWriter,
  imported only when this sink is enabled).
- ``console``: on a terminal, a rich progress bar (steps done/total, elapsed,
  ETA) with one summary line per step printed above it; when stderr is not an
  interactive terminal (CI logs, ``> file``, or rich's ``TTY_INTERACTIVE=0``),
  no live display, just the plain lines with elapsed/ETA appended. The ETA is the
  mean ``timing_s/step`` of the RL steps logged so far times the steps left: service
  start-up, SFT and validation do not count.
- ``log_generations``: validation samples (trainer.log_val_generations) to
  ``run_dir/val_generations.jsonl``, TensorBoard text, a wandb table, an mlflow artifact.

Not here: metric computation, aggregation across ranks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from tandem.controller.trackers import SINKS, make_sink

KNOWN_LOGGERS = ("console", "jsonl", "tensorboard", *SINKS)
GENERATIONS_FILE = "val_generations.jsonl"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"

# verl metric key -> short label in the per-step console line, in display order.
CONSOLE_METRICS: dict[str, str] = {
    "critic/score/mean": "score",
    "val/accuracy": "val_acc",
    "actor/pg_loss": "pg_loss",
    "actor/ppo_kl": "kl",
    "critic/vf_loss": "vf_loss",
    "response_length/mean": "resp_len",
    "timing_s/step": "step_s",
}


def _scalar(key: str, value: Any) -> int | float:
    """Python number from an int/float/numpy/torch scalar; TypeError naming the key otherwise."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"metric {key!r} must be a scalar number, got {type(value).__name__}: {value!r}")
    return value


def _step_of(line: str) -> int | None:
    """The step of a metrics.jsonl line; None for a torn one (a crash mid-write)."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def _merged(line: str, step: int, values: dict) -> str:
    """`line` with `values` added when it is `step`'s."""
    return json.dumps({**json.loads(line), **values}) + "\n" if _step_of(line) == step else line


def _hms(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


class _Phase:
    """Handle returned by ``Tracking.phase``: call ``advance()`` once per unit of work."""

    def __init__(self, tracking: Tracking, name: str, total: int, task: TaskID | None) -> None:
        self._tracking, self.name, self.total, self._task = tracking, name, total, task
        self.completed = 0
        self._start = time.monotonic()

    def advance(self, n: int = 1) -> None:
        before, self.completed = self.completed, self.completed + n
        progress, console = self._tracking._progress, self._tracking._console
        if progress is not None and self._task is not None:
            progress.update(self._task, completed=self.completed)
        elif console is not None and self.total > 0:
            # Plain mode: one line per 10% so CI logs show the phase is alive.
            if self.completed < self.total and self.completed * 10 // self.total > before * 10 // self.total:
                console.print(f"{self.name} {self.completed}/{self.total} ({_hms(time.monotonic() - self._start)} elapsed)")


class Tracking:
    """Fan-out of ``{key: scalar}`` dicts to the enabled sinks. Use as a context manager or call ``close()``."""

    def __init__(
        self,
        run_dir: str,
        loggers: list[str],
        total_steps: int,
        project: str = "tandem",
        experiment: str = "run",
        config: dict | None = None,
    ) -> None:
        unknown = [name for name in loggers if name not in KNOWN_LOGGERS]
        if unknown:
            raise ValueError(f"unknown loggers {unknown}; known loggers: {list(KNOWN_LOGGERS)}")
        if total_steps < 0:
            raise ValueError(f"total_steps must be >= 0, got {total_steps}")
        self.run_dir, self.total_steps = run_dir, total_steps
        self.project, self.experiment = project, experiment
        os.makedirs(run_dir, exist_ok=True)

        self._jsonl = open(os.path.join(run_dir, METRICS_FILE), "a", encoding="utf-8") if "jsonl" in loggers else None
        self._jsonl_steps = self._rewrite_jsonl(lambda lines: lines) if self._jsonl is not None else set()
        self._tb = None
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import (
                SummaryWriter,  # heavy import: only when asked for
            )

            self._tb = SummaryWriter(log_dir=os.path.join(run_dir, TENSORBOARD_DIR))
        self._sinks = {name: make_sink(name, run_dir, project, experiment, config or {})
                       for name in loggers if name in SINKS}

        self._console: Console | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if "console" in loggers:
            # No markup (metric keys and phase names may contain "["), no wrapping of plain lines.
            self._console = Console(stderr=True, highlight=False, markup=False, emoji=False, soft_wrap=True)
            if self._console.is_interactive:  # a TTY, unless TTY_INTERACTIVE=0 says otherwise
                self._progress = Progress(
                    TextColumn("[bold]{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    TextColumn("ETA {task.fields[eta]}"),
                    console=self._console,
                )
                self._task = self._progress.add_task(escape(f"{project}/{experiment}"), total=total_steps, eta="?")
                self._progress.start()
        self._start = time.monotonic()
        self._step_seconds: dict[int, float] = {}  # RL step -> its timing_s/step (the ETA's basis)
        self._closed = False

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record ``metrics`` as of training step ``step`` (steps completed so far) in every sink."""
        if self._closed:
            raise RuntimeError("Tracking.log called after close()")
        if "step" in metrics:
            raise ValueError("'step' is reserved for the step argument; do not put it in metrics")
        values = {key: _scalar(key, value) for key, value in metrics.items()}
        if self._jsonl is not None and step in self._jsonl_steps:
            self._rewrite_jsonl(lambda lines: [_merged(line, step, values) for line in lines])
        elif self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, **values}) + "\n")
            self._jsonl.flush()
            self._jsonl_steps.add(step)
        if self._tb is not None:
            for key, value in values.items():
                self._tb.add_scalar(key, value, global_step=step)
            self._tb.flush()
        for sink in self._sinks.values():
            sink.log(values, step)
        if "timing_s/step" in values:
            self._step_seconds[step] = values["timing_s/step"]
        if self._console is not None:
            self._log_console(values, step)

    def rewind(self, step: int) -> None:
        """The run went back to `step` (a checkpoint): forget what was logged for later steps."""
        if self._jsonl is not None:
            self._jsonl_steps = self._rewrite_jsonl(lambda lines: [x for x in lines if _step_of(x) <= step])
        if self._tb is not None:
            from torch.utils.tensorboard import SummaryWriter

            log_dir = self._tb.log_dir
            self._tb.close()
            self._tb = SummaryWriter(log_dir=log_dir, purge_step=step + 1)

    def _rewrite_jsonl(self, change: Callable[[list[str]], list[str]]) -> set[int]:
        """metrics.jsonl's lines (a torn one, from a crash mid-write, dropped) through `change`,
        written whole and swapped in -> the steps it then holds."""
        path = self._jsonl.name
        self._jsonl.close()
        with open(path, encoding="utf-8") as f:
            lines = change([line for line in f if _step_of(line) is not None])
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(lines)
        os.replace(path + ".tmp", path)
        self._jsonl = open(path, "a", encoding="utf-8")
        return {_step_of(line) for line in lines}

    def _log_console(self, values: dict[str, int | float], step: int) -> None:
        assert self._console is not None
        parts = [f"step {step}/{self.total_steps}"]
        parts += [f"{label} {values[key]:.4g}" for key, label in CONSOLE_METRICS.items() if key in values]
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=min(step, self.total_steps), eta=self.eta(step))
        else:
            parts.append(f"{_hms(time.monotonic() - self._start)} elapsed, ETA {self.eta(step)}")
        self._console.print(" | ".join(parts))

    def eta(self, step: int) -> str:
        """Time left after `step`: the mean seconds of the RL steps logged so far x the steps left."""
        if not self._step_seconds:
            return "?"
        mean = sum(self._step_seconds.values()) / len(self._step_seconds)
        return _hms(mean * max(self.total_steps - step, 0))

    def log_generations(self, samples: list[tuple[str, str, float]], step: int) -> None:
        """Validation samples (prompt, response, score) as of `step`, to every sink that takes text."""
        rows = [{"step": step, "input": p, "output": o, "score": s} for p, o, s in samples]
        with open(os.path.join(self.run_dir, GENERATIONS_FILE), "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        if self._tb is not None:
            text = "\n\n".join(f"**input** {r['input']}\n\n**output** {r['output']}\n\n**score** {r['score']}"
                                for r in rows)
            self._tb.add_text("val/generations", text, global_step=step)
        for sink in self._sinks.values():
            sink.log_generations(rows, step)

    @contextmanager
    def phase(self, name: str, total: int) -> Iterator[_Phase]:
        """A separate progress bar for a sub-task (e.g. SFT warm-up steps); ``advance()`` the handle.

        Usage: ``with tracking.phase("sft", total=100) as p: ... p.advance()``.
        """
        task = None
        if self._progress is not None:
            task = self._progress.add_task(escape(name), total=total, eta="-")
        elif self._console is not None:
            self._console.print(f"{name} started ({total} total)")
        handle = _Phase(self, name, total, task)
        try:
            yield handle
        finally:
            if self._progress is not None and task is not None:
                self._progress.remove_task(task)
            if self._console is not None:
                self._console.print(
                    f"{name} finished {handle.completed}/{total} in {_hms(time.monotonic() - handle._start)}"
                )

    def close(self) -> None:
        """Stop the live display and close the files. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._progress is not None:
            self._progress.stop()
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        for sink in self._sinks.values():
            sink.close()

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
