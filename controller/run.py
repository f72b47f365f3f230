"""One run of `tandem run`: the `Run` object, from its directory to its summary.

A `Run` owns its config, run directory, tokenizer, data, the role clients and its Stateful
parts. In order it: opens the directory (fresh, or the interrupted run's when resuming),
starts or attaches to the services (controller/launchers/), warms the policy up (accuracy
before SFT, SFT, reference := policy, critic trunk from the policy, validation at step 0)
or restores a checkpoint, runs the RL steps (controller/step.py) with validation every
`trainer.test_freq` and checkpoints every `trainer.save_freq`, validates and saves at the
end, and writes summary.json and curves.png. When a service dies on the way
(controller/recovery.py) it is restarted and the run goes back to its latest complete
checkpoint with the resume path (`_restore`), or to the beginning when there is none.

Its Stateful parts, saved in controller_state.json and restored on resume: the data
cursor, the KL controller, the step counter and the summary values a resumed run still
needs. The file's keys are those written before this object existed, so older checkpoints
resume.

It stops early when `self.cancel` (controller/cancel.py) is set from another thread: before
the next SFT or RL step, or when a generation is cut by the services; then it saves the last
completed step if `trainer.save_freq` asks and raises RunCancelled.

Deliberately not here: one step's algorithm (controller/step.py), checkpoint files
(controller/checkpointing.py), making the run directory (controller/run_dir.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import asdict

from tandem.algos.kl import get_kl_controller
from tandem.config import TandemConfig
from tandem.controller import checkpointing
from tandem.controller.async_train import train_async
from tandem.controller.cancel import CancelFlag, RunCancelled, save_on_cancel
from tandem.controller.data import Cursor, collate, load_split, prompt_tools, with_epoch_steps
from tandem.controller.launchers import LaunchContext, Launcher, endpoints, get_launcher
from tandem.controller.plot import plot_run
from tandem.controller.recovery import STATELESS, Supervisor
from tandem.controller.roles import Roles, attach_endpoints, connect, needed_roles
from tandem.controller.run_dir import CONFIG_FILE, create_run_dir, reopen_run_dir
from tandem.controller.sft import run_sft, split_dev
from tandem.controller.step import StepContext, ppo_step
from tandem.controller.tracking import Tracking
from tandem.controller.validation import greedy_accuracy, run_validation
from tandem.data.batch import DataProto
from tandem.logging import get_logger
from tandem.tokenizer import load_tokenizer

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
    run still needs: the accuracy after SFT (rl_gain is measured from it) and the warm start's
    other facts, which a resumed run does not redo."""

    RESUMED = ("val_accuracy_after_sft", "val_accuracy_init", "sft_steps", "sft_dev_accuracy")

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
        self.run_dir, self.resume_from = run_dir, resume_from
        self.started = time.time() if started is None else started
        self.run_id = os.path.basename(run_dir)
        self.tokenizer = load_tokenizer(cfg.actor_rollout_ref.model.tokenizer_path)
        d, k = cfg.data, cfg.algorithm.kl_ctrl
        skipped: dict[str, dict] = {"train": {}, "val": {}}  # rows no step can use, by reason (summary.json)
        tools = prompt_tools(cfg.actor_rollout_ref.rollout.multi_turn)  # schemas the chat prompts show
        self.train, self.dev = split_dev(load_split(d, "train", self.tokenizer, skipped["train"], tools),
                                         cfg.trainer.sft, d.seed)  # dev: SFT's stop (controller/sft.py)
        self.val = load_split(d, "val", self.tokenizer, skipped["val"], tools)
        self.cfg = cfg = with_epoch_steps(cfg, len(self.train))  # verl's trainer.total_epochs
        # Stateful parts (controller_state.json)
        self.cursor = Cursor(len(self.train), seed=d.seed, shuffle=d.shuffle)
        self.kl_ctrl = get_kl_controller(k.type, k.kl_coef, k.target_kl, k.horizon)
        self.steps = StepCounter()
        self.summary = Summary(experiment=cfg.trainer.experiment_name,
                               adv_estimator=cfg.algorithm.adv_estimator, val_size=len(self.val), restarts=0,
                               data_rows_skipped=skipped)
        self._initial_state = self.state_dict()  # what a run with no checkpoint yet goes back to
        # while the services are up (execute)
        self.roles: Roles | None = None
        self.tracking: Tracking | None = None
        self.cancel = CancelFlag()  # set from another thread: the run stops at its next safe point
        self.completed_state: dict | None = None  # state_dict() as of the last completed step
        self.supervisor: Supervisor | None = None
        self.warmed_up = False  # warm start done, or a checkpoint restored

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

    async def execute(self, launcher: Launcher | None = None) -> dict:
        """Services up (`launcher`'s, by default the local launcher's), warm start or restore,
        RL steps, final validation and checkpoint, services down; then summary.json and
        curves.png -> the summary. RunCancelled when `self.cancel` was set."""
        s = self.cfg.services
        launcher = launcher or get_launcher(self.cfg.trainer.launcher)(LaunchContext(
            os.path.join(self.run_dir, CONFIG_FILE), self.run_dir, self.run_id, s.startup_timeout_s,
            hosts={role: getattr(s, role).host for role in ("actor", "rollout", "critic", "reward")}, cfg=self.cfg))
        self.tracking = self.open_tracking()
        try:
            self.roles = await self._connect(launcher)
            if self.resume_from:
                await self._restore(self.resume_from)
                self.summary["resumed_from"] = self.resume_from
            await self.supervisor.guard(self._body, self._recover)
        except Exception as e:
            if not self.cancel.is_set():
                raise
            # stopped at a safe point, or a generation cut by the services (ABORTED)
            await save_on_cancel(self.roles, self.run_dir, self.cfg.trainer, self.completed_state)
            raise RunCancelled(self.cancel.reason) from e
        finally:
            try:
                if self.supervisor is not None:
                    await self.supervisor.close()
                self.tracking.close()
                if self.roles is not None:
                    await self.roles.close()
            finally:  # the services are stopped whatever the closing above raised
                launcher.stop()
        return self._write_summary()

    def open_tracking(self) -> Tracking:
        t = self.cfg.trainer
        return Tracking(self.run_dir, list(t.logger), t.total_training_steps, t.project_name, t.experiment_name,
                        config=asdict(self.cfg))

    async def _connect(self, launcher: Launcher) -> Roles:
        roles = needed_roles(self.cfg)
        attach = attach_endpoints(self.cfg, roles)
        connected = await connect(self.cfg, await endpoints(launcher, roles, attach), self.run_id,
                                  self.tokenizer.pad_token_id)
        self.supervisor = Supervisor(launcher, connected, [r for r in roles if not attach[r]],
                                     {r: e for r, e in attach.items() if e}, self.cfg.trainer.max_restarts,
                                     self.cfg.services.startup_timeout_s, on_restart=self._restarted)
        self.supervisor.watch()
        return connected

    async def _body(self) -> None:
        """What the supervisor runs (again after a recovery): warm start unless a checkpoint
        was restored, the RL steps left, the end."""
        t = self.cfg.trainer
        if not self.warmed_up:
            await self._warm_start()
            self.warmed_up = True
            if t.max_restarts and t.save_freq > 0:  # global_step_0: what a crash before step save_freq goes back to
                await self._save()
        await self._train()
        await self._finish()

    async def _warm_start(self) -> None:
        """Before RL: accuracy of the initial policy, SFT, reference := policy, critic trunk
        from the policy, and validation at step 0 (the two accuracies with trainer.val_before_train)."""
        t, roles = self.cfg.trainer, self.roles
        await roles.sync_rollout(force=True)
        if t.val_before_train:
            self.summary["val_accuracy_init"] = await self._greedy_accuracy()
        if t.sft.total_steps > 0:
            t0 = time.time()
            with self.tracking.phase("sft", t.sft.total_steps) as bar:
                sft = await run_sft(roles.actor, self.train, self.tokenizer, t.sft, bar,
                                    self._dev_accuracy if self.dev else None, self.cancel.check)
            self.summary["sft_time_s"] = time.time() - t0
            self.summary["sft_final"] = sft["metrics"]
            self.summary["sft_steps"], self.summary["sft_dev_accuracy"] = sft["steps"], sft["dev_accuracy"]
            await roles.sync_rollout(force=True)
        self.cancel.check()
        await roles.actor.set_reference()
        if roles.critic is not None and self.cfg.critic.init_from_policy:
            init = os.path.join(self.run_dir, "checkpoints", "init")
            await roles.critic.load_checkpoint(await roles.actor.save_checkpoint(os.path.join(init, "actor")),
                                               trunk_only=True)
            shutil.rmtree(init)  # a policy-sized copy (optimizer included) no run goes back to
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(init))  # empty unless save_freq asks for checkpoints
        if t.val_before_train:  # verl's key: false starts RL without validating first
            metrics = await self._validate(step=0)
            self.summary["val_accuracy_after_sft"] = metrics.get("val/accuracy")
            self.tracking.log(metrics or {"val/accuracy": 0.0}, step=0)

    async def _restore(self, ckpt: str) -> None:
        """Policy, reference, optimizers and critic as they were, then this object's state;
        metrics logged for later steps (a crash after the checkpoint) are dropped."""
        state = await checkpointing.restore(self.roles, ckpt)
        await self.roles.sync_rollout(force=True)  # a restarted rollout may hold any version
        self.load_state_dict(state)
        self.tracking.rewind(self.steps.done)
        self.warmed_up = True

    async def _recover(self) -> None:
        """After a restart: every role back to the latest complete checkpoint (none yet: every
        service with state restarted fresh, and the run from its beginning)."""
        ckpt = checkpointing.latest(self.run_dir)
        if ckpt is not None:
            await self._restore(ckpt)
        else:
            for role in self.supervisor.started:
                if role not in STATELESS:
                    await self.supervisor.restart(role, RuntimeError("no checkpoint to go back to"), counted=False)
            self.load_state_dict(self._initial_state)
            self.tracking.rewind(-1)
            self.warmed_up = False
        print(f"tandem: recovered; going on from {ckpt or 'the beginning (no checkpoint yet)'}", flush=True)
        self.summary["recovered_from"] = [*(self.summary.get("recovered_from") or []), ckpt]
        self.tracking.log({"trainer/restarts": self.supervisor.restarts}, step=self.steps.done)

    def _restarted(self, role: str, why: str) -> None:
        self.summary["restarts"] = self.supervisor.restarts
        if role in STATELESS:  # nothing goes back: the failed call is sent again
            self.tracking.log({"trainer/restarts": self.supervisor.restarts}, step=self.steps.done)

    async def _train(self) -> None:
        """The RL steps after the last one done, with validation and checkpoints on their cadence."""
        t = self.cfg.trainer
        if self.cfg.async_training.mode != "sync":  # generation overlapping training
            return await train_async(self)
        ctx = StepContext(self.roles, self.cfg, self.tokenizer, self.kl_ctrl)
        t0 = time.time()
        self.completed_state = self.state_dict()
        for step in range(self.steps.done + 1, t.total_training_steps + 1):
            self.cancel.check()
            self.roles.set_step(step)
            await self.after_step(step, await ppo_step(ctx, self.next_prompts, step))
        self.summary["rl_time_s"] = time.time() - t0

    async def after_step(self, step: int, metrics: dict[str, float],
                         validating: Callable[[], AbstractAsyncContextManager] = nullcontext) -> None:
        """What follows every RL step, in the synchronous and the asynchronous loop: validation and a
        checkpoint on their cadence (the last step's come with the end of the run), the step's metrics
        logged, the step counted done. `validating`: held around a validation (the asynchronous loop
        pauses its producer and brings the rollout to the actor's weights)."""
        t = self.cfg.trainer
        last = step == t.total_training_steps
        if t.test_freq and step % t.test_freq == 0 and not last:
            async with validating():
                metrics.update(await self._validate(step))
        self.tracking.log(metrics, step=step)
        self.steps.done = step
        self.completed_state = self.state_dict()
        if t.save_freq > 0 and step % t.save_freq == 0 and not last:
            await self._save()

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
        if self.cfg.trainer.save_freq > 0:  # as verl: none at all when save_freq <= 0
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

    async def _dev_accuracy(self) -> float:
        """Greedy accuracy of the current policy on the dev split (SFT's stop)."""
        await self.roles.sync_rollout(force=True)  # the run's first syncs (as after SFT)
        return await greedy_accuracy(self.roles.rollout, self.roles.reward, self.dev, self.tokenizer,
                                     self.cfg.data.max_response_length, self.cfg)

    async def _validate(self, step: int) -> dict[str, float]:
        samples = [] if self.cfg.trainer.log_val_generations else None
        metrics = await run_validation(self.roles, self.val, self.tokenizer, self.cfg, step, samples)
        if samples:
            self.tracking.log_generations(samples, step)
        return metrics

    async def _save(self) -> str:
        return await checkpointing.save(self.roles, self.run_dir, self.state_dict(), self.cfg.trainer.max_ckpt_to_keep)

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
    """`tandem run`: one whole run -> its summary (RunCancelled after SIGTERM, should the
    cancellation that SIGTERM sends be lost: the run stops at its next step)."""
    from tandem.controller import interrupt

    r = Run.open(cfg)
    interrupt.when_requested(lambda: r.cancel.set("interrupted by SIGTERM"))
    return await r.execute()
