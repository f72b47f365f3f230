"""A whole run: prepare files, start services, SFT warm start, RL steps, evaluate, save.

Everything a run produces lands in its run directory: config.yaml, tokenizer/, data/,
logs/<role>.log, metrics.jsonl, tensorboard/, curves.png, checkpoints/, summary.json.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import replace

from controller import checkpointing, launcher
from controller.clients import ActorClient, CriticClient, RewardClient, RolloutClient
from controller.data import Cursor, collate, load_examples
from controller.evaluate import greedy_accuracy
from controller.plot import plot_run
from controller.rollout_replicas import RolloutReplicas, replica_roles
from controller.sft import run_sft
from controller.step import Roles, ppo_step
from controller.tracking import Tracking
from controller.validation import run_validation
from controller.weight_sync import sync_weights
from tandem.algos.kl import AdaptiveKLController, FixedKLController
from tandem.config import TandemConfig, load_config, to_yaml
from tandem.logging import get_logger

_log = get_logger("controller.loop")


def prepare_run_dir(cfg: TandemConfig) -> tuple[TandemConfig, str]:
    """Create the run directory; materialise the built-in tokenizer and data when used."""
    t = cfg.trainer
    run_id = f"{t.experiment_name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    run_dir = os.path.abspath(os.path.join(t.default_local_dir, run_id))
    os.makedirs(run_dir)
    model = cfg.actor_rollout_ref.model
    if model.tokenizer_path is None and model.path is not None:
        model = replace(model, tokenizer_path=model.path)
    if model.tokenizer_path is None:
        from tandem.tasks.arithmetic import build_tokenizer

        model = replace(model, tokenizer_path=build_tokenizer(os.path.join(run_dir, "tokenizer")))
    data = cfg.data
    if data.train_files is None:
        from tandem.tasks.arithmetic import write_dataset

        train, val = write_dataset(os.path.join(run_dir, "data"), data.builtin_train_size,
                                   data.builtin_val_size, data.seed)
        data = replace(data, train_files=train, val_files=val)
    cfg = replace(cfg, data=data, actor_rollout_ref=replace(cfg.actor_rollout_ref, model=model))
    with open(os.path.join(run_dir, "config.yaml"), "w") as f:
        f.write(to_yaml(cfg))
    return cfg, run_dir


def needed_roles(cfg: TandemConfig) -> list[str]:
    roles = ["actor", "reward"]
    if cfg.actor_rollout_ref.rollout.mode == "standalone":
        roles += replica_roles(cfg.services.rollout.replicas)
    if cfg.algorithm.adv_estimator == "gae":
        roles.append("critic")
    return roles


def make_kl_ctrl(cfg: TandemConfig):
    k = cfg.algorithm.kl_ctrl
    if k.type == "adaptive":
        return AdaptiveKLController(k.kl_coef, k.target_kl, k.horizon)
    return FixedKLController(k.kl_coef)


def resumed_config(cfg: TandemConfig, ckpt: str) -> tuple[TandemConfig, str]:
    """The interrupted run's own config (its tokenizer, data, shapes), with this command's
    step count and resume keys (a resumed run may be extended)."""
    run_dir = checkpointing.run_dir_of(ckpt)
    saved = load_config(os.path.join(run_dir, "config.yaml"))
    trainer = replace(saved.trainer, total_training_steps=cfg.trainer.total_training_steps,
                      resume_mode=cfg.trainer.resume_mode, resume_from_path=cfg.trainer.resume_from_path)
    return replace(saved, trainer=trainer), run_dir


async def run(cfg: TandemConfig) -> dict:
    from transformers import AutoTokenizer

    started = time.time()
    resume_from = checkpointing.find_resume(cfg)
    if resume_from:
        cfg, run_dir = resumed_config(cfg, resume_from)
        print(f"tandem: resuming {run_dir} from {resume_from}", flush=True)
    else:
        cfg, run_dir = prepare_run_dir(cfg)
        print(f"tandem: run directory {run_dir}", flush=True)
    run_id = os.path.basename(run_dir)
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.tokenizer_path)
    d = cfg.data
    train = load_examples(d.train_files, tokenizer, d.max_prompt_length)
    val = load_examples(d.val_files, tokenizer, d.max_prompt_length) if d.val_files else []

    roles = needed_roles(cfg)
    s = cfg.services
    attach = launcher.attach_endpoints(cfg, roles)
    procs = launcher.start(roles, os.path.join(run_dir, "config.yaml"), run_dir, run_id, attach, cfg)
    clients = {}
    tracking = Tracking(run_dir, list(cfg.trainer.logger), cfg.trainer.total_training_steps,
                        cfg.trainer.project_name, cfg.trainer.experiment_name)
    try:
        await launcher.wait_ready(procs, run_dir, s.startup_timeout_s)
        kinds = {"actor": ActorClient, "reward": RewardClient, "rollout": RolloutClient, "critic": CriticClient}
        for role in roles:
            clients[role] = kinds[launcher.service_of(role)](procs.endpoints[role], timeout_s=s.rpc_timeout_s,
                                                             metadata={"x-run-id": run_id})
            await clients[role].wait_healthy(timeout_s=s.startup_timeout_s)
        standalone = cfg.actor_rollout_ref.rollout.mode == "standalone"
        rollout = (RolloutReplicas([clients[r] for r in replica_roles(s.rollout.replicas)], tokenizer.pad_token_id)
                   if standalone else RolloutClient(procs.endpoints["actor"], timeout_s=s.rpc_timeout_s))
        roles_ = Roles(actor=clients["actor"], rollout=rollout, reward=clients["reward"],
                       critic=clients.get("critic"), standalone_rollout=standalone)
        summary = await _train(cfg, run_dir, roles_, tokenizer, train, val, tracking, resume_from)
    finally:
        tracking.close()
        for c in clients.values():
            await c.close()
        launcher.stop(procs)
    summary["wall_time_s"] = time.time() - started
    summary["run_dir"] = run_dir
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    try:
        summary["plot"] = plot_run(os.path.join(run_dir, "metrics.jsonl"), os.path.join(run_dir, "curves.png"))
    except (ValueError, FileNotFoundError) as e:
        _log.warning("plot.skipped", reason=str(e))
    return summary


async def _sync_rollout(roles: Roles) -> None:
    if roles.standalone_rollout:  # forced: attached rollouts may have seen another run's versions
        await sync_weights(roles.actor, roles.rollout, force=True)


async def _warm_start(cfg, run_dir, roles: Roles, tokenizer, train, val, tracking, summary) -> None:
    """Before RL: accuracy of the initial policy, SFT, reference := policy, critic trunk,
    and validation at step 0."""
    t, d = cfg.trainer, cfg.data

    async def evaluate() -> float | None:
        if not val:
            return None
        return await greedy_accuracy(roles.rollout, roles.reward, val, tokenizer, d.max_response_length)

    await _sync_rollout(roles)
    summary["val_accuracy_init"] = await evaluate()
    if t.sft.total_steps > 0:
        t0 = time.time()
        with tracking.phase("sft", t.sft.total_steps) as bar:
            sft_metrics = await run_sft(roles.actor, train, tokenizer, t.sft.total_steps,
                                        t.sft.batch_size, t.sft.data_seed, bar)
        summary["sft_time_s"] = time.time() - t0
        summary["sft_final"] = sft_metrics
        await _sync_rollout(roles)
    await roles.actor.set_reference()
    if roles.critic is not None and cfg.critic.init_from_policy:
        path = await roles.actor.save_checkpoint(os.path.join(run_dir, "checkpoints", "init", "actor"))
        await roles.critic.load_checkpoint(path, trunk_only=True)
    val_metrics = await run_validation(roles, val, tokenizer, cfg, step=0)
    summary["val_accuracy_after_sft"] = val_metrics.get("val/accuracy")
    tracking.log(val_metrics or {"val/accuracy": 0.0}, step=0)


async def _train(cfg, run_dir, roles: Roles, tokenizer, train, val, tracking, resume_from=None) -> dict:
    t, d = cfg.trainer, cfg.data
    summary: dict = {"experiment": t.experiment_name, "adv_estimator": cfg.algorithm.adv_estimator,
                     "val_size": len(val)}
    kl_ctrl = make_kl_ctrl(cfg)
    cursor = Cursor(len(train), seed=d.seed, shuffle=d.shuffle)
    first = 1
    if resume_from:  # policy, reference, optimizers, data cursor and KL controller as they were
        state = await checkpointing.restore(roles, resume_from)
        await _sync_rollout(roles)
        cursor.load_state_dict(state["data_cursor"])
        kl_ctrl.load_state_dict(state["kl_ctrl"])
        summary["val_accuracy_after_sft"] = state.get("val_accuracy_after_sft")
        summary["resumed_from"] = resume_from
        first = int(state["global_step"]) + 1
    else:
        await _warm_start(cfg, run_dir, roles, tokenizer, train, val, tracking, summary)

    def controller_state() -> dict:
        return {"data_cursor": cursor.state_dict(), "kl_ctrl": kl_ctrl.state_dict(),
                "val_accuracy_after_sft": summary.get("val_accuracy_after_sft")}

    t0 = time.time()
    for step in range(first, t.total_training_steps + 1):
        for c in (roles.actor, roles.rollout, roles.reward, roles.critic):
            if c is not None:
                c.set_metadata(x_step=step)
        def next_prompts(k: int):  # DAPO dynamic sampling may take several batches per step
            return collate([train[i] for i in cursor.next(k)], tokenizer.pad_token_id)
        metrics = await ppo_step(roles, next_prompts, cfg, kl_ctrl, tokenizer, step)
        if t.test_freq and step % t.test_freq == 0 and step != t.total_training_steps:
            metrics.update(await run_validation(roles, val, tokenizer, cfg, step))
        tracking.log(metrics, step=step)
        if t.save_freq and step % t.save_freq == 0 and step != t.total_training_steps:
            await checkpointing.save(roles, run_dir, step, controller_state())
    summary["rl_time_s"] = time.time() - t0
    final_metrics = await run_validation(roles, val, tokenizer, cfg, t.total_training_steps)
    final = final_metrics.get("val/accuracy")
    summary["val_accuracy_final"] = final
    summary["val_metrics_final"] = final_metrics
    if final is not None and summary["val_accuracy_after_sft"] is not None:
        summary["rl_gain"] = final - summary["val_accuracy_after_sft"]
    tracking.log(final_metrics or {"val/accuracy": 0.0}, step=t.total_training_steps)

    summary["checkpoint"] = await checkpointing.save(roles, run_dir, t.total_training_steps, controller_state())
    return summary
