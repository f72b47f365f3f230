"""Checks of the data and trainer sections: batch and length bounds, steps, resume, checkpoints, loggers.

DAPO's data.gen_batch_size is checked with the rest of DAPO in algorithm.py.
"""
from __future__ import annotations

from tandem.config.errors import check
from tandem.config.schema import TandemConfig

# trainer.logger: the sinks of controller/tracking.py (KNOWN_LOGGERS). The library does not import the
# controller; tests/unit/test_config_checks.py keeps the two equal.
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
# verl's loggers Tandem does not offer, and why
NOT_OFFERED = {"swanlab": "swanlab's releases require protobuf < 7, Tandem's gRPC code protobuf >= 7.35; use wandb "
                          "or mlflow"}
# trainer.resume_mode: start fresh, the latest checkpoint of this experiment, or trainer.resume_from_path.
RESUME_MODES = ("disable", "auto", "resume_path")
# data.truncation: what happens to a prompt over data.max_prompt_length when data.filter_overlong_prompts is false
TRUNCATIONS = ("error", "left", "right", "middle")
# trainer.on_controller_restart: what a restarted controller service does with the run it was running.
RESTART_POLICIES = ("resume", "fail")


def check_data(cfg: TandemConfig) -> None:
    """data.*: batch and response lengths at least 1, a known truncation."""
    d = cfg.data
    check(d.train_batch_size >= 1, "data.train_batch_size", "must be >= 1")
    check(d.max_response_length >= 1, "data.max_response_length", "must be >= 1")
    check(d.truncation in TRUNCATIONS, "data.truncation", f"{d.truncation!r}; known: {list(TRUNCATIONS)}")
    check(d.builtin_task in ("add", "mul_tool"), "data.builtin_task", f"{d.builtin_task!r}; known: add, mul_tool")


def check_trainer(cfg: TandemConfig) -> None:
    """trainer.*: resume mode and path, save and step counts."""
    t = cfg.trainer
    check(t.resume_mode in RESUME_MODES, "trainer.resume_mode", f"{t.resume_mode!r}; known: {sorted(RESUME_MODES)}")
    check(t.resume_mode != "resume_path" or bool(t.resume_from_path),
          "trainer.resume_from_path", "must be set when trainer.resume_mode=resume_path")
    check(t.on_controller_restart in RESTART_POLICIES, "trainer.on_controller_restart",
          f"{t.on_controller_restart!r}; known: {', '.join(RESTART_POLICIES)}")
    check(t.max_ckpt_to_keep is None or t.max_ckpt_to_keep >= 1, "trainer.max_ckpt_to_keep",
          "must be >= 1 (null: keep every checkpoint; trainer.save_freq=-1: none at all)")
    check(t.max_restarts >= 0, "trainer.max_restarts", "must be >= 0")
    check(t.total_epochs is None or t.total_epochs >= 1, "trainer.total_epochs", "must be >= 1")
    check(t.total_training_steps is not None or t.total_epochs is not None, "trainer.total_training_steps",
          "null needs trainer.total_epochs (steps = epochs x full batches of data.train_files)")
    check(t.total_training_steps is None or t.total_training_steps >= 0, "trainer.total_training_steps",
          "must be >= 0")
    check(t.critic_warmup >= 0, "trainer.critic_warmup", "must be >= 0")
    check(t.log_val_generations >= 0, "trainer.log_val_generations", "must be >= 0")


def check_sft(cfg: TandemConfig) -> None:
    """trainer.sft.*: step count, and the dev-accuracy stop (a fraction, evaluated at least every step)."""
    s = cfg.trainer.sft
    check(s.total_steps == "auto" or (isinstance(s.total_steps, int) and not isinstance(s.total_steps, bool)
                                      and s.total_steps >= 0), "trainer.sft.total_steps",
          f"{s.total_steps!r}: must be >= 0 (a whole number; 0: no warm start) or auto (the built-in task's warm "
          "start; none on your data)")
    check(s.batch_size >= 1, "trainer.sft.batch_size", "must be >= 1")
    stop = s.stop_at_accuracy
    if stop is not None:
        check(stop == "auto" or (isinstance(stop, (int, float)) and not isinstance(stop, bool) and 0 < stop <= 1),
              "trainer.sft.stop_at_accuracy", f"{stop!r} must be a greedy accuracy in (0, 1], null to run "
              "total_steps, or auto (the built-in task's threshold; null on your data)")
        check(s.eval_freq >= 1, "trainer.sft.eval_freq", "must be >= 1 (SFT steps between dev evaluations)")
        check(s.dev_size >= 1, "trainer.sft.dev_size", "must be >= 1 (prompts held out as the dev split)")


def check_loggers(cfg: TandemConfig) -> None:
    """trainer.logger names known sinks only."""
    t = cfg.trainer
    for name, why in NOT_OFFERED.items():
        check(name not in t.logger, "trainer.logger", f"{name!r} is not offered: {why}")
    unknown = set(t.logger) - set(LOGGERS)
    check(not unknown, "trainer.logger", f"unknown {sorted(unknown)}; known: {', '.join(LOGGERS)}")
