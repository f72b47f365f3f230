"""Run checkpoints: written every `trainer.save_freq` RL steps and at the last (none when it is
<= 0, as in verl); the newest `trainer.max_ckpt_to_keep` kept; found and restored for
`trainer.resume_mode=auto|resume_path` (verl's keys).

A checkpoint is `<run_dir>/checkpoints/global_step_N/` with `actor/` and `critic/`
(megatron dist_checkpointing directories, resharded on load) and `controller_state.json`
(step, data cursor, KL controller, accuracy after SFT), written last and atomically: a
directory without it is incomplete and never resumed from. Saving into a directory that
holds a complete checkpoint first removes its controller_state.json, so a crash mid-save
never leaves a marker beside half-replaced parts. A kill at any moment of a save leaves
the previous checkpoint loadable (bench/checkpoint_kills.py kills saves at random moments).
A save that fails (a full disk: RESOURCE_EXHAUSTED from a service, or found before it starts
by `check_room`) removes its incomplete directory and raises.

Deliberately not here: what the controller state holds (the Run's Stateful parts,
controller/run.py); this module writes and reads the dict it is given.
"""
from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import re
import shutil

from tandem import checkpoint_room
from tandem.checkpoint import DONE
from tandem.config import ConfigError, TandemConfig
from tandem.logging import get_logger

STATE_FILE = "controller_state.json"
ROLE_PARTS = ("actor", "critic")  # the services' directories in a checkpoint
_log = get_logger("controller.checkpointing")


def step_dir(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "checkpoints", f"global_step_{step}")


async def save(roles, run_dir: str, state: dict, keep: int | None = None) -> str:
    """Actor and critic, then `state` (the controller's, `global_step` included) as
    controller_state.json -> the checkpoint directory; then only the newest `keep` complete
    checkpoints are left (None: all). ResourceExhausted before anything is
    written when the disk has less room than the run's last checkpoint took; a save that fails
    leaves no incomplete directory behind. A cancelled one (a service died mid-save and the run
    goes back) leaves it: a service may still be writing there; without controller_state.json it
    is never resumed from, and the step's next save replaces it."""
    ckpt = step_dir(run_dir, state["global_step"])
    check_room(run_dir, ckpt)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(ckpt, STATE_FILE))  # incomplete until the new one is written
        await roles.actor.save_checkpoint(os.path.join(ckpt, "actor"))
        if roles.critic is not None:
            await roles.critic.save_checkpoint(os.path.join(ckpt, "critic"))
        tmp = os.path.join(ckpt, STATE_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(ckpt, STATE_FILE))
    except asyncio.CancelledError:
        raise
    except BaseException:
        if not is_complete(ckpt):  # never resumed from: its parts only take the room
            shutil.rmtree(ckpt, ignore_errors=True)
        raise
    if keep is not None:
        prune(run_dir, keep)
    return ckpt


def prune(run_dir: str, keep: int) -> list[str]:
    """Remove all but the newest `keep` complete checkpoints -> the directories removed. Only
    after a newer one is complete, so a crash at any moment leaves one to go back to; incomplete
    directories are left to the save that made them (it may still be writing there)."""
    old = complete_steps(run_dir)[:-keep] if keep > 0 else []
    for _, d in old:
        os.remove(os.path.join(d, STATE_FILE))  # first: a crash mid-removal leaves no checkpoint that looks whole
        shutil.rmtree(d)
    if old:
        _log.info("checkpoints.pruned", removed=[os.path.basename(d) for _, d in old], kept=keep)
    return [d for _, d in old]


def check_room(run_dir: str, ckpt: str) -> None:
    """ResourceExhausted naming `ckpt` and both sizes when the free space where it goes is less
    than the run's last complete checkpoint took (a save writes it whole before any old one goes)."""
    last = latest(run_dir)
    if last is None:
        return  # the first save: each service checks the bytes it writes (tandem/checkpoint_room.py)
    needed = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(last) for f in files)
    free = checkpoint_room.free_bytes(ckpt)
    if free < needed:
        raise checkpoint_room.no_room(ckpt, needed, free, why=f" as the last one ({os.path.basename(last)}) did")


def is_complete(ckpt: str) -> bool:
    """controller_state.json written, and every role's part it holds complete."""
    parts = [os.path.join(ckpt, p) for p in ROLE_PARTS if os.path.exists(os.path.join(ckpt, p))]
    return (os.path.isfile(os.path.join(ckpt, STATE_FILE)) and bool(parts)
            and all(os.path.isfile(os.path.join(p, DONE)) for p in parts))


def complete_steps(run_dir: str) -> list[tuple[int, str]]:
    """(step, directory) of a run's complete checkpoints, oldest first."""
    steps = []
    for d in glob.glob(os.path.join(run_dir, "checkpoints", "global_step_*")):
        m = re.fullmatch(r"global_step_(\d+)", os.path.basename(d))
        if m and is_complete(d):
            steps.append((int(m.group(1)), d))
    return sorted(steps)


def latest(run_dir: str) -> str | None:
    """The complete checkpoint of the highest step in a run directory."""
    steps = complete_steps(run_dir)
    return steps[-1][1] if steps else None


def find_resume(cfg: TandemConfig) -> str | None:
    """The checkpoint to resume from, or None for a fresh run."""
    t = cfg.trainer
    if t.resume_mode == "disable":
        return None
    if t.resume_mode == "resume_path":
        path = os.path.abspath(t.resume_from_path)
        if not is_complete(path):
            raise ConfigError(f"trainer.resume_from_path: {path!r} is not a complete checkpoint (no {STATE_FILE}, "
                              f"or a part without {DONE}); expected .../checkpoints/global_step_N")
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
