"""A controller-service run: the Run whose metrics and log lines also go to the run's record.

`RecordingTracking` is the run's Tracking (console, metrics.jsonl, TensorBoard as configured)
that also appends each step's metrics, a one-line summary of them, and the start and end of
each phase (SFT) to the records' events, which StreamEvents, `tandem logs` and the status
page read. `ServiceRun` is a Run that tracks that way.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tandem.controller.run import Run
from tandem.controller.service.records import Records
from tandem.controller.tracking import CONSOLE_METRICS, Tracking


def summary_line(values: Mapping[str, float], step: int, total: int) -> str:
    """'step 3/10 | score 0.5 | pg_loss ...', the console's per-step line without the timings."""
    parts = [f"step {step}/{total}"]
    parts += [f"{label} {values[key]:.4g}" for key, label in CONSOLE_METRICS.items() if key in values]
    return " | ".join(parts)


class RecordingTracking(Tracking):
    def __init__(self, records: Records, record_id: str, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records, self.record_id = records, record_id
        self.step = 0

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        super().log(metrics, step)
        values = {k: float(v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
        self.step = step
        self.records.metrics(self.record_id, step, values)
        self.records.log(self.record_id, step, summary_line(values, step, self.total_steps))

    @contextmanager
    def phase(self, name: str, total: int) -> Iterator:
        self.records.log(self.record_id, self.step, f"{name} started ({total} steps)")
        with super().phase(name, total) as handle:
            yield _RecordedPhase(handle, lambda line: self.records.log(self.record_id, self.step, line))
        self.records.log(self.record_id, self.step, f"{name} finished {handle.completed}/{total}")


class _RecordedPhase:
    """A phase handle that also records a line at every tenth of the phase (the SFT warm start
    is long: `tandem logs -f` shows it moving)."""

    def __init__(self, handle, record_line):
        self._handle, self._record_line = handle, record_line

    def advance(self, n: int = 1) -> None:
        before = self._handle.completed
        self._handle.advance(n)
        done, total = self._handle.completed, self._handle.total
        if total > 0 and done < total and done * 10 // total > before * 10 // total:
            self._record_line(f"{self._handle.name} {done}/{total}")

    def __getattr__(self, name: str):
        return getattr(self._handle, name)


class ServiceRun(Run):
    """A Run executed by the controller service for the record `record_id`."""

    records: Records
    record_id: str

    def open_tracking(self) -> Tracking:
        t = self.cfg.trainer
        return RecordingTracking(self.records, self.record_id, self.run_dir, list(t.logger), t.total_training_steps,
                                 t.project_name, t.experiment_name)
