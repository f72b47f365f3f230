"""Run checkpoints: written every `trainer.save_freq` RL steps and at the end; found and
restored for `trainer.resume_mode=auto|resume_path` (verl's keys).

A checkpoint is `<run_dir>/checkpoints/global_step_N/` with `actor/` and `critic/`
(megatron dist_checkpointing directories, resharded on load) and `controller_state.json`
(step, data cursor, KL controller, accuracy after SFT), written last and atomically: a
directory without it is incomplete and never resumed from.

Deliberately not here: what the controller state holds (the Run's Stateful parts,
controller/run.py); this module writes and reads the dict it is given.
"""
from __future__ import annotations

import glob
import json
import os
import re

from tandem.config import ConfigError, TandemConfig
from tandem.logging import get_logger

STATE_FILE = "controller_state.json"
_log = get_logger("controller.checkpointing")


def step_dir(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "checkpoints", f"global_step_{step}")


async def save(roles, run_dir: str, state: dict) -> str:
    """Actor and critic, then `state` (the controller's, `global_step` included) as
    controller_state.json -> the checkpoint directory."""
    ckpt = step_dir(run_dir, state["global_step"])
    await roles.actor.save_checkpoint(os.path.join(ckpt, "actor"))
    if roles.critic is not None:
        await roles.critic.save_checkpoint(os.path.join(ckpt, "critic"))
    tmp = os.path.join(ckpt, STATE_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ckpt, STATE_FILE))
    return ckpt


def latest(run_dir: str) -> str | None:
    """The complete checkpoint of the highest step in a run directory."""
    steps = []
    for d in glob.glob(os.path.join(run_dir, "checkpoints", "global_step_*")):
        m = re.fullmatch(r"global_step_(\d+)", os.path.basename(d))
        if m and os.path.isfile(os.path.join(d, STATE_FILE)):
            steps.append((int(m.group(1)), d))
    return max(steps)[1] if steps else None


def find_resume(cfg: TandemConfig) -> str | None:
    """The checkpoint to resume from, or None for a fresh run."""
    t = cfg.trainer
    if t.resume_mode == "disable":
        return None
    if t.resume_mode == "resume_path":
        path = os.path.abspath(t.resume_from_path)
        if not os.path.isfile(os.path.join(path, STATE_FILE)):
            raise ConfigError(f"trainer.resume_from_path: {path!r} is not a complete checkpoint "
                              f"(no {STATE_FILE}); expected .../checkpoints/global_step_N")
        return path
    runs = sorted(glob.glob(os.path.join(t.default_local_dir, f"{t.experiment_name}-*")),
                  key=os.path.getmtime, reverse=True)
    for run_dir in runs:
        ckpt = latest(run_dir)
        if ckpt:
            return os.path.abspath(ckpt)
    _log.info("resume.none_found", experiment=t.experiment_name, dir=t.default_local_dir)
    return None


def run_dir_of(ckpt: str) -> str:
    return os.path.dirname(os.path.dirname(ckpt))


def read_state(ckpt: str) -> dict:
    with open(os.path.join(ckpt, STATE_FILE)) as f:
        return json.load(f)


async def restore(roles, ckpt: str) -> dict:
    """Load actor (policy, reference, optimizer) and critic; -> the controller state."""
    await roles.actor.load_checkpoint(os.path.join(ckpt, "actor"))
    if roles.critic is not None:
        await roles.critic.load_checkpoint(os.path.join(ckpt, "critic"))
    return read_state(ckpt)
