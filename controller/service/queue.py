"""The controller service's queue: submitted runs execute one after another on the service pool.

One thread takes the oldest queued record, moves it to running, opens its Run (a fresh run
directory named after the record, or the interrupted run's directory when a restarted
controller resumes it), lends it the pool's services (configured for it, released after it)
and records how it ended: succeeded with its summary, failed with the error, or cancelled.
Each run gets its own event loop in that thread, so the controller's gRPC server and status
page stay responsive while a step computes.

`cancel` ends a queued run at once and asks a running one to stop at its next safe point
(the Run's CancelFlag; the servicer also interrupts the services' generations).
`recover` is what a restarted controller does with the run that was running when its
predecessor died: fail it, or queue it again to resume from its latest checkpoint, as the
run's `trainer.on_controller_restart` says; queued runs stay queued.
"""
from __future__ import annotations

import asyncio
import json
import os
import threading

from tandem.config import TandemConfig, load_config
from tandem.controller import checkpointing
from tandem.controller.cancel import RunCancelled
from tandem.controller.launchers import LaunchContext
from tandem.controller.run_dir import CONFIG_FILE, create_run_dir, reopen_run_dir
from tandem.controller.service.events import ServiceRun
from tandem.controller.service.pool import PoolLauncher, ServicePool
from tandem.controller.service.records import Records, RunRecord
from tandem.logging import get_logger
from tandem.rpc.errors import FailedPrecondition, NotFound

_log = get_logger("controller.service.queue")


class RunQueue:
    def __init__(self, records: Records, pool: ServicePool):
        self.records, self.pool = records, pool
        self.current: tuple[str, ServiceRun] | None = None
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="tandem-runs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def stop(self, timeout_s: float = 120.0) -> None:
        """Stop taking runs; the running one stops at its next safe point and stays `running`
        in the records (the next controller's `recover` decides what becomes of it)."""
        self._stopping = True
        if self.current is not None:
            self.current[1].cancel.set("the controller is stopping")
        self.wake()
        self._thread.join(timeout_s)

    def cancel(self, run_id: str) -> RunRecord:
        record = self.records.get(run_id)
        if record is None:
            raise NotFound(f"run_id: no run {run_id!r}")
        if record.ended:
            raise FailedPrecondition(f"run_id: run {run_id!r} has already {record.state}")
        if self.records.set_state(run_id, "cancelled", only_from=("queued",), cancel_requested=True):
            return self.records.get(run_id)
        self.records.update(run_id, cancel_requested=True)
        self.records.log(run_id, record.last_step, "cancel requested")
        current = self.current
        if current is not None and current[0] == run_id:
            current[1].cancel.set()
        return self.records.get(run_id)

    # ---- the queue thread -----------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and (record := self.records.next_queued()) is None:
                    self._wake.wait(timeout=1.0)
            if self._stopping:
                return
            self._run_one(record)

    def _run_one(self, record: RunRecord) -> None:
        if not self.records.set_state(record.id, "running", only_from=("queued",)):
            return  # cancelled in the meantime
        _log.info("run.started", run=record.id)
        try:
            summary = asyncio.run(self._execute(record))
        except RunCancelled as e:
            if not self._stopping:
                self.records.log(record.id, self.records.get(record.id).last_step, f"stopped: {e}")
                self.records.set_state(record.id, "cancelled", only_from=("running",))
        except BaseException as e:  # noqa: BLE001 - any failure ends this run, not the controller
            _log.exception("run.failed", run=record.id)
            self.records.log(record.id, self.records.get(record.id).last_step, f"failed: {type(e).__name__}: {e}")
            self.records.set_state(record.id, "failed", only_from=("running",), error=f"{type(e).__name__}: {e}")
        else:
            self.records.set_state(record.id, "succeeded", only_from=("running",),
                                   summary_json=json.dumps(summary, default=str))
        finally:
            self.current = None

    async def _execute(self, record: RunRecord) -> dict:
        run = open_run(record, self.pool.with_tokens(load_config(text=record.config_yaml)))
        run.records, run.record_id = self.records, record.id
        self.records.update(record.id, run_dir=run.run_dir, resumed_from=run.resume_from or "")
        self.records.log(record.id, record.last_step, f"run directory {run.run_dir}" +
                         (f", resuming from {run.resume_from}" if run.resume_from else ""))
        self.current = (record.id, run)
        if self.records.get(record.id).cancel_requested or self._stopping:  # cancelled while it was opening
            run.cancel.set()
        ctx = LaunchContext(os.path.join(run.run_dir, CONFIG_FILE), run.run_dir, run.run_id,
                            run.cfg.services.startup_timeout_s)
        launcher = PoolLauncher(ctx, self.pool, on_configured=lambda pids: self.records.update(
            record.id, service_pids_json=json.dumps(pids)))  # shown while the run runs
        try:
            return await run.execute(launcher)
        finally:
            self.records.update(record.id, service_pids_json=json.dumps(launcher.pids))


def open_run(record: RunRecord, cfg: TandemConfig) -> ServiceRun:
    """The record's Run: resumed from `record.resume_from` (a restarted controller), from the
    checkpoint the config's own `trainer.resume_mode` finds, or fresh in `<dir>/<record id>`."""
    resume = record.resume_from or checkpointing.find_resume(cfg)
    if resume:
        cfg, run_dir = reopen_run_dir(cfg, resume)
        return ServiceRun(cfg, run_dir, resume)
    cfg, run_dir = create_run_dir(cfg, _free_name(cfg.trainer.default_local_dir, record.id))
    return ServiceRun(cfg, run_dir)


def _free_name(parent: str, name: str) -> str:
    """`name`, or `name-2`, `name-3`... when a directory of that name exists (a run restarted
    from the start after its controller died keeps its first attempt's directory)."""
    candidate, n = name, 1
    while os.path.exists(os.path.join(parent, candidate)):
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def recover(records: Records) -> dict[str, str]:
    """After a controller restart: each run left `running` is failed or queued again to resume
    (its `trainer.on_controller_restart`) -> {run id: what was done}."""
    done = {}
    for record in records.list(states=("running",)):
        step = record.last_step
        if record.cancel_requested:
            records.set_state(record.id, "cancelled", only_from=("running",))
            done[record.id] = "cancelled"
        elif load_config(text=record.config_yaml).trainer.on_controller_restart == "fail":
            records.log(record.id, step, "the controller restarted while the run was running: failed "
                                         "(trainer.on_controller_restart=fail)")
            records.set_state(record.id, "failed", only_from=("running",),
                              error="the controller restarted while the run was running")
            done[record.id] = "failed"
        else:
            ckpt = checkpointing.latest(record.run_dir) if record.run_dir else None
            records.log(record.id, step, "the controller restarted while the run was running: queued again, "
                                         + (f"to resume from {ckpt}" if ckpt else "from the start (no checkpoint)"))
            records.set_state(record.id, "queued", only_from=("running",), resume_from=ckpt or "", started=0.0)
            done[record.id] = "resumed" if ckpt else "restarted"
    return done
