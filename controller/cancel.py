"""Stopping a run at a safe point: the flag a Run checks between phases and steps, and the
checkpoint it leaves behind.

`CancelFlag.set` may be called from any thread (the controller service's CancelRun). The run
checks it before each RL step and SFT step and between warm-start phases; the services cut a
generation in progress themselves (LifecycleService.Interrupt), so the run stops within one
step or one decode step. A cancelled run with `trainer.save_freq` > 0 saves the last step it
completed (the controller state as it was at the end of that step, even when the next step
had begun), so `trainer.resume_mode=auto` can continue it.

Deliberately not here: who cancels (controller/service/queue.py), releasing the services
(the launcher's stop).
"""
from __future__ import annotations

import os
import threading

from tandem.controller import checkpointing


class RunCancelled(Exception):
    """The run stopped early because it was cancelled."""


class CancelFlag:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = "cancelled"

    def set(self, reason: str = "cancelled") -> None:
        self.reason = reason
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raise RunCancelled when the run has been cancelled."""
        if self._event.is_set():
            raise RunCancelled(self.reason)


async def save_on_cancel(roles, run_dir: str, trainer, completed_state: dict | None) -> str | None:
    """The checkpoint of the last completed RL step when `trainer.save_freq` asks for checkpoints
    (the existing one if that step was saved already) -> its directory, or None."""
    if trainer.save_freq <= 0 or roles is None or not completed_state or not completed_state.get("global_step"):
        return None
    ckpt = checkpointing.step_dir(run_dir, completed_state["global_step"])
    if os.path.isfile(os.path.join(ckpt, checkpointing.STATE_FILE)):
        return ckpt
    return await checkpointing.save(roles, run_dir, completed_state, trainer.max_ckpt_to_keep)
