"""One run of `tandem run`: the `Run` object, from its directory to its summary.

A `Run` owns its config, run directory, tokenizer, data, the role clients and its Stateful
parts. In order it: opens the directory (fresh, or the interrupted run's when resuming),
starts or attaches to the services (controller/launchers/), warms the policy up (accuracy
before SFT, SFT, reference := policy, critic trunk from the policy, validation at step 0)
or restores a checkpoint, runs the RL steps (controller/step.py) with validation every
`trainer.test_freq` and checkpoints every `trainer.save_freq`, validates and saves at the
end, and writes summary.json and curves.png.

Its Stateful parts, saved in controller_state.json and restored on resume: the data
cursor, the KL controller, the step counter and the summary values a resumed run still
needs. The file's keys are those written before this object existed, so older checkpoints
resume.

Deliberately not here: one step's algorithm (controller/step.py), checkpoint files
(controller/checkpointing.py), making the run directory (controller/run_dir.py).
"""
from __future__ import annotations

import json
import os
import time

from controller import checkpointing
from controller.data import Cursor, collate, load_examples
from controller.launchers import LaunchContext, Launcher, endpoints, get_launcher
from controller.plot import plot_run
from controller.roles import Roles, connect, needed_roles
from controller.run_dir import CONFIG_FILE, create_run_dir, reopen_run_dir
from controller.sft import run_sft
from controller.step import StepContext, ppo_step
from controller.tracking import Tracking
from controller.validation import greedy_accuracy, run_validation
from tandem.algos.kl import get_kl_controller
from tandem.config import TandemConfig
from tandem.data.batch import DataProto
from tandem.logging import get_logger

_log = get_logger("controller.run")


class StepCounter:
    """RL steps completed; Stateful as controller_state.json's `global_step`."""

    def __init__(self) -> None:
        self.done = 0

    def state_dict(self) -> dict:
        return {"global_step": self.done}

    def load_state_dict(self, state: dict) -> None:
        self.done = int(state["global_step"])


class Summary:
    """summary.json's values, filled in as the run goes. Stateful for the values a resumed
    run still needs (the accuracy after SFT, which rl_gain is measured from)."""

    RESUMED = ("val_accuracy_after_sft",)

    def __init__(self, **values) -> None:
        self.values = dict(values)

    def __setitem__(self, key: str, value) -> None:
        self.values[key] = value

    def get(self, key: str):
        return self.values.get(key)

    def state_dict(self) -> dict:
        return {k: self.values.get(k) for k in self.RESUMED}

    def load_state_dict(self, state: dict) -> None:
        self.values.update((k, state.get(k)) for k in self.RESUMED)


class Run:
    """One run: config, run directory, tokenizer, data, services and Stateful parts."""

    def __init__(self, cfg: TandemConfig, run_dir: str, resume_from: str | None = None,
                 started: float | None = None):
        from transformers import AutoTokenizer

        self.cfg, self.run_dir, self.resume_from = cfg, run_dir, resume_from
        self.started = time.time() if started is None else started
        self.run_id = os.path.basename(run_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.tokenizer_path)
        d, k = cfg.data, cfg.algorithm.kl_ctrl
        self.train = load_examples(d.train_files, self.tokenizer, d.max_prompt_length)
        self.val = load_examples(d.val_files, self.tokenizer, d.max_prompt_length) if d.val_files else []
        # Stateful parts (controller_state.json)
        self.cursor = Cursor(len(self.train), seed=d.seed, shuffle=d.shuffle)
        self.kl_ctrl = get_kl_controller(k.type, k.kl_coef, k.target_kl, k.horizon)
        self.steps = StepCounter()
        self.summary = Summary(experiment=cfg.trainer.experiment_name,
                               adv_estimator=cfg.algorithm.adv_estimator, val_size=len(self.val))
        # while the services are up (execute)
        self.roles: Roles | None = None
        self.tracking: Tracking | None = None

    @classmethod
    def open(cls, cfg: TandemConfig) -> Run:
        """A fresh run, or the interrupted one `trainer.resume_mode` points at."""
        started = time.time()
        resume_from = checkpointing.find_resume(cfg)
        if resume_from:
            cfg, run_dir = reopen_run_dir(cfg, resume_from)
            print(f"tandem: resuming {run_dir} from {resume_from}", flush=True)
        else:
            cfg, run_dir = create_run_dir(cfg)
            print(f"tandem: run directory {run_dir}", flush=True)
        return cls(cfg, run_dir, resume_from, started)

    # ---- Stateful ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """controller_state.json: the same keys, in the same order, as older checkpoints."""
        return {"data_cursor": self.cursor.state_dict(), "kl_ctrl": self.kl_ctrl.state_dict(),
                **self.summary.state_dict(), **self.steps.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.cursor.load_state_dict(state["data_cursor"])
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.summary.load_state_dict(state)
        self.steps.load_state_dict(state)

    # ---- the run ----------------------------------------------------------------------------

    async def execute(self) -> dict:
        """Services up, warm start or restore, RL steps, final validation and checkpoint,
        services down; then summary.json and curves.png -> the summary."""
        t = self.cfg.trainer
        s = self.cfg.services
        launcher = get_launcher(t.launcher)(LaunchContext(
            os.path.join(self.run_dir, CONFIG_FILE), self.run_dir, self.run_id, s.startup_timeout_s,
            hosts={role: getattr(s, role).host for role in ("actor", "rollout", "critic", "reward")}, cfg=self.cfg))
        self.tracking = Tracking(self.run_dir, list(t.logger), t.total_training_steps, t.project_name,
                                 t.experiment_name)
        try:
            self.roles = await self._connect(launcher)
            await (self._restore() if self.resume_from else self._warm_start())
            await self._train()
            await self._finish()
        finally:
            self.tracking.close()
            if self.roles is not None:
                await self.roles.close()
            launcher.stop()
        return self._write_summary()

    async def _connect(self, launcher: Launcher) -> Roles:
        roles = needed_roles(self.cfg)
        attach = {r: getattr(self.cfg.services, r).endpoint for r in roles}
        return await connect(self.cfg, await endpoints(launcher, roles, attach), self.run_id)

    async def _warm_start(self) -> None:
        """Before RL: accuracy of the initial policy, SFT, reference := policy, critic trunk
        from the policy, and validation at step 0."""
        t, roles = self.cfg.trainer, self.roles
        await roles.sync_rollout()
        self.summary["val_accuracy_init"] = await self._greedy_accuracy()
        if t.sft.total_steps > 0:
            t0 = time.time()
            with self.tracking.phase("sft", t.sft.total_steps) as bar:
                sft_metrics = await run_sft(roles.actor, self.train, self.tokenizer, t.sft.total_steps,
                                            t.sft.batch_size, t.sft.data_seed, bar)
            self.summary["sft_time_s"] = time.time() - t0
            self.summary["sft_final"] = sft_metrics
            await roles.sync_rollout()
        await roles.actor.set_reference()
        if roles.critic is not None and self.cfg.critic.init_from_policy:
            path = await roles.actor.save_checkpoint(os.path.join(self.run_dir, "checkpoints", "init", "actor"))
            await roles.critic.load_checkpoint(path, trunk_only=True)
        metrics = await self._validate(step=0)
        self.summary["val_accuracy_after_sft"] = metrics.get("val/accuracy")
        self.tracking.log(metrics or {"val/accuracy": 0.0}, step=0)

    async def _restore(self) -> None:
        """Policy, reference, optimizers and critic as they were, then this object's state."""
        state = await checkpointing.restore(self.roles, self.resume_from)
        await self.roles.sync_rollout()
        self.load_state_dict(state)
        self.summary["resumed_from"] = self.resume_from

    async def _train(self) -> None:
        """The RL steps after the last one done, with validation and checkpoints on their cadence."""
        t = self.cfg.trainer
        ctx = StepContext(self.roles, self.cfg, self.tokenizer, self.kl_ctrl)
        t0 = time.time()
        for step in range(self.steps.done + 1, t.total_training_steps + 1):
            self.roles.set_step(step)
            metrics = await ppo_step(ctx, self.next_prompts, step)
            last = step == t.total_training_steps  # the final validation and checkpoint follow
            if t.test_freq and step % t.test_freq == 0 and not last:
                metrics.update(await self._validate(step))
            self.tracking.log(metrics, step=step)
            self.steps.done = step
            if t.save_freq and step % t.save_freq == 0 and not last:
                await self._save()
        self.summary["rl_time_s"] = time.time() - t0

    async def _finish(self) -> None:
        """Validation after the last step, rl_gain, and the final checkpoint."""
        last = self.cfg.trainer.total_training_steps
        metrics = await self._validate(last)
        final, after_sft = metrics.get("val/accuracy"), self.summary.get("val_accuracy_after_sft")
        self.summary["val_accuracy_final"] = final
        self.summary["val_metrics_final"] = metrics
        if final is not None and after_sft is not None:
            self.summary["rl_gain"] = final - after_sft
        self.tracking.log(metrics or {"val/accuracy": 0.0}, step=last)
        self.steps.done = last
        self.summary["checkpoint"] = await self._save()

    # ---- what the phases share -------------------------------------------------------------

    def next_prompts(self, k: int) -> DataProto:
        """The next k training prompts (DAPO dynamic sampling may take several batches a step)."""
        return collate([self.train[i] for i in self.cursor.next(k)], self.tokenizer.pad_token_id)

    async def _greedy_accuracy(self) -> float | None:
        if not self.val:
            return None
        return await greedy_accuracy(self.roles.rollout, self.roles.reward, self.val, self.tokenizer,
                                     self.cfg.data.max_response_length, self.cfg)

    async def _validate(self, step: int) -> dict[str, float]:
        return await run_validation(self.roles, self.val, self.tokenizer, self.cfg, step)

    async def _save(self) -> str:
        return await checkpointing.save(self.roles, self.run_dir, self.state_dict())

    def _write_summary(self) -> dict:
        summary = dict(self.summary.values, wall_time_s=time.time() - self.started, run_dir=self.run_dir)
        with open(os.path.join(self.run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        try:
            summary["plot"] = plot_run(os.path.join(self.run_dir, "metrics.jsonl"),
                                       os.path.join(self.run_dir, "curves.png"))
        except (ValueError, FileNotFoundError) as e:
            _log.warning("plot.skipped", reason=str(e))
        return summary


async def run(cfg: TandemConfig) -> dict:
    """`tandem run`: one whole run -> its summary."""
    return await Run.open(cfg).execute()
