"""A run's directory: created for a fresh run, reopened for a resumed one.

A fresh run gets `<trainer.default_local_dir>/<experiment>-<time>-<4 hex>/` with the
resolved `config.yaml` every service starts from, and the built-in task's tokenizer and
data when the config names none. A resumed run takes the interrupted run's own directory
and config (its tokenizer, data and shapes), with this command's step count, resume keys and launcher.

Deliberately not here: what goes in the directory later (metrics, logs, checkpoints,
summary: controller/run.py and the modules it calls), finding the checkpoint to resume
from (controller/checkpointing.py).
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import replace

from tandem.config import TandemConfig, load_config, to_yaml
from tandem.controller import checkpointing
from tandem.controller.sft import resolve_stop

CONFIG_FILE = "config.yaml"


def new_run_id(cfg: TandemConfig) -> str:
    return f"{cfg.trainer.experiment_name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def create_run_dir(cfg: TandemConfig, run_id: str | None = None) -> tuple[TandemConfig, str]:
    """Create the run directory (named `run_id`, default a new one); materialise the built-in
    tokenizer and data when used -> (the config with their paths filled in, the directory)."""
    t = cfg.trainer
    run_id = run_id or new_run_id(cfg)
    run_dir = os.path.abspath(os.path.join(t.default_local_dir, run_id))
    os.makedirs(run_dir)
    return materialise(cfg, run_dir), run_dir


def materialise(cfg: TandemConfig, run_dir: str) -> TandemConfig:
    """Write the built-in tokenizer and data under `run_dir` when the config names none, and
    `run_dir/config.yaml` -> the config with their paths filled in."""
    model = cfg.actor_rollout_ref.model
    if model.tokenizer_path is None and model.path is not None:
        model = replace(model, tokenizer_path=model.path)
    data = cfg.data
    tool_task = data.train_files is None and data.builtin_task == "mul_tool"
    if model.tokenizer_path is None:
        from tandem.tasks.arithmetic import CHARS, build_tokenizer
        from tandem.tasks.calculator_tool import TOOL_CHARS

        model = replace(model, tokenizer_path=build_tokenizer(os.path.join(run_dir, "tokenizer"),
                                                              CHARS + TOOL_CHARS if tool_task else None))
    sft = resolve_stop(cfg.trainer.sft, builtin_task=data.train_files is None)
    cfg = replace(cfg, trainer=replace(cfg.trainer, sft=sft))
    if data.train_files is None:
        from tandem.tasks.arithmetic import write_dataset
        from tandem.tasks.calculator_tool import DIGITS, OP, tool_task_rows

        task = dict(digits=DIGITS, op=OP, rows=tool_task_rows) if tool_task else {}
        train, val = write_dataset(os.path.join(run_dir, "data"), data.builtin_train_size,
                                   data.builtin_val_size, data.seed, data.builtin_fixed_width, **task)
        data = replace(data, train_files=train, val_files=val)
    cfg = replace(cfg, data=data, actor_rollout_ref=replace(cfg.actor_rollout_ref, model=model))
    cfg = profile_paths(cfg, run_dir)
    with open(os.path.join(run_dir, CONFIG_FILE), "w") as f:
        f.write(to_yaml(cfg))
    return cfg


def profile_paths(cfg: TandemConfig, run_dir: str) -> TandemConfig:
    """Each `profile` section's save_path made absolute: null -> <run dir>/profile, relative -> under the run dir."""
    def fix(p):
        return replace(p, save_path=os.path.join(run_dir, p.save_path or "profile")) if p.use_profile else p
    a = cfg.actor_rollout_ref
    a = replace(a, actor=replace(a.actor, profile=fix(a.actor.profile)), ref=replace(a.ref, profile=fix(a.ref.profile)),
                rollout=replace(a.rollout, profile=fix(a.rollout.profile)))
    return replace(cfg, actor_rollout_ref=a, critic=replace(cfg.critic, profile=fix(cfg.critic.profile)))


def reopen_run_dir(cfg: TandemConfig, ckpt: str) -> tuple[TandemConfig, str]:
    """The interrupted run's own config, with this command's step count and resume keys
    (a resumed run may be extended) -> (that config, its directory)."""
    run_dir = checkpointing.run_dir_of(ckpt)
    saved = load_config(os.path.join(run_dir, CONFIG_FILE))
    trainer = replace(saved.trainer, total_training_steps=cfg.trainer.total_training_steps,
                      resume_mode=cfg.trainer.resume_mode, resume_from_path=cfg.trainer.resume_from_path,
                      launcher=cfg.trainer.launcher)
    return replace(saved, trainer=trainer), run_dir
