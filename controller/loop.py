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

from controller import launcher
from controller.clients import ActorClient, CriticClient, RewardClient, RolloutClient
from controller.data import Cursor, collate, load_examples
from controller.evaluate import greedy_accuracy
from controller.plot import plot_run
from controller.sft import run_sft
from controller.step import Roles, ppo_step
from controller.tracking import Tracking
from tandem.algos.kl import AdaptiveKLController, FixedKLController
from tandem.config import TandemConfig, to_yaml
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
        roles.append("rollout")
    if cfg.algorithm.adv_estimator == "gae":
        roles.append("critic")
    return roles


def make_kl_ctrl(cfg: TandemConfig):
    k = cfg.algorithm.kl_ctrl
    if k.type == "adaptive":
        return AdaptiveKLController(k.kl_coef, k.target_kl, k.horizon)
    return FixedKLController(k.kl_coef)


async def run(cfg: TandemConfig) -> dict:
    from transformers import AutoTokenizer

    started = time.time()
    cfg, run_dir = prepare_run_dir(cfg)
    run_id = os.path.basename(run_dir)
    print(f"tandem: run directory {run_dir}", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.tokenizer_path)
    d = cfg.data
    train = load_examples(d.train_files, tokenizer, d.max_prompt_length)
    val = load_examples(d.val_files, tokenizer, d.max_prompt_length) if d.val_files else []

    roles = needed_roles(cfg)
    s = cfg.services
    attach = {r: getattr(s, r).endpoint for r in roles}
    procs = launcher.start(roles, os.path.join(run_dir, "config.yaml"), run_dir, run_id, attach)
    clients = {}
    tracking = Tracking(run_dir, list(cfg.trainer.logger), cfg.trainer.total_training_steps,
                        cfg.trainer.project_name, cfg.trainer.experiment_name)
    try:
        await launcher.wait_ready(procs, run_dir, s.startup_timeout_s)
        kinds = {"actor": ActorClient, "reward": RewardClient, "rollout": RolloutClient, "critic": CriticClient}
        for role in roles:
            clients[role] = kinds[role](procs.endpoints[role], timeout_s=s.rpc_timeout_s,
                                        metadata={"x-run-id": run_id})
            await clients[role].wait_healthy(timeout_s=s.startup_timeout_s)
        standalone = cfg.actor_rollout_ref.rollout.mode == "standalone"
        rollout = clients["rollout"] if standalone else RolloutClient(procs.endpoints["actor"],
                                                                      timeout_s=s.rpc_timeout_s)
        roles_ = Roles(actor=clients["actor"], rollout=rollout, reward=clients["reward"],
                       critic=clients.get("critic"), standalone_rollout=standalone)
        summary = await _train(cfg, run_dir, roles_, tokenizer, train, val, tracking)
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
    if roles.standalone_rollout:
        weights, version = await roles.actor.export_weights()
        await roles.rollout.load_weights(weights, version)


async def _train(cfg, run_dir, roles: Roles, tokenizer, train, val, tracking) -> dict:
    t, d = cfg.trainer, cfg.data
    summary: dict = {"experiment": t.experiment_name, "adv_estimator": cfg.algorithm.adv_estimator,
                     "val_size": len(val)}

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
        path = await roles.actor.save_checkpoint(os.path.join(run_dir, "checkpoints", "init", "actor.pt"))
        await roles.critic.load_checkpoint(path, trunk_only=True)
    summary["val_accuracy_after_sft"] = await evaluate()
    tracking.log({"val/accuracy": summary["val_accuracy_after_sft"] or 0.0}, step=0)

    kl_ctrl = make_kl_ctrl(cfg)
    cursor = Cursor(len(train), seed=d.seed, shuffle=d.shuffle)
    t0 = time.time()
    for step in range(1, t.total_training_steps + 1):
        for c in (roles.actor, roles.rollout, roles.reward, roles.critic):
            if c is not None:
                c.set_metadata(x_step=step)
        prompts = collate([train[i] for i in cursor.next(d.train_batch_size)], tokenizer.pad_token_id)
        metrics = await ppo_step(roles, prompts, cfg, kl_ctrl, tokenizer, step)
        if t.test_freq and step % t.test_freq == 0 and step != t.total_training_steps:
            metrics["val/accuracy"] = await evaluate()
        tracking.log(metrics, step=step)
    summary["rl_time_s"] = time.time() - t0
    final = await evaluate()
    summary["val_accuracy_final"] = final
    if final is not None and summary["val_accuracy_after_sft"] is not None:
        summary["rl_gain"] = final - summary["val_accuracy_after_sft"]
    tracking.log({"val/accuracy": final or 0.0}, step=t.total_training_steps)

    ckpt = os.path.join(run_dir, "checkpoints", f"global_step_{t.total_training_steps}")
    summary["checkpoint"] = ckpt
    await roles.actor.save_checkpoint(os.path.join(ckpt, "actor.pt"))
    if roles.critic is not None:
        await roles.critic.save_checkpoint(os.path.join(ckpt, "critic.pt"))
    state = {"global_step": t.total_training_steps, "data_cursor": cursor.state_dict(),
             "kl_ctrl": kl_ctrl.state_dict()}
    tmp = os.path.join(ckpt, "controller_state.json.tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, os.path.join(ckpt, "controller_state.json"))
    return summary
