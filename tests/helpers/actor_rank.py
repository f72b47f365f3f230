"""One rank of the actor parallel tests (launched by tests/multirank/test_actor_parallel.py).

usage: python actor_rank.py RANK WORLD TP RENDEZVOUS OUT TOKENIZER [--pp N] [--ep N] [--cp N] [--sp]
                             [--init-from CKPT] [--load-from CKPT] [--set KEY=VALUE ...]
                             [--grouped] [--own-prompts]

All ranks build the actor exactly as the service does (ActorWorker + RankGroup); rank 0
drives the front door: log-probs of a fixed batch, one PPO update (two mini-batches; the old
log-probs it computed itself, the first mini-batch's, written as "update_old"), log-probs after,
the new weights as a Hugging Face export, and a checkpoint. Without
--init-from it first saves its initial weights to OUT/init (a random init differs across
pipeline stages, so PP layouts start from TP=1's). With --load-from it loads that
checkpoint (saved at any layout) and only writes log-probs. Rank 0 writes OUT/result.pt.
A failure raises (non-zero exit).
--critic: a critic at the same layout beside the actor (CriticWorker, CriticFront): its values of the
batch, one update (writes "values", "critic_metrics", "values_after"), a checkpoint under OUT/critic.
--grouped: the batch's rows share prompts in pairs (the rollout's n=2 samples); --own-prompts: each row
still runs its own copy of its prompt (the reference for the actor's prompt sharing).
--set adds config overrides (e.g. a Hugging Face model.path);
ACTOR_RANK_OVERRIDES (space-separated key=value) adds more when running it by hand.
"""
import os

import torch

from tandem.data.batch import DataProto
from tandem.process_exit import exit_process


def fixed_batch(vocab: int, pad_id: int, grouped: bool = False):
    """8 rows of random tokens; grouped: rows 2k and 2k+1 share row 2k's prompt (n=2 samples)."""
    from tandem.data.batch import DataProto

    g = torch.Generator().manual_seed(0)
    b, lp, r = 8, 6, 5
    prompt_len = torch.tensor([6, 3, 4, 6, 2, 5, 6, 1])
    resp_len = torch.tensor([5, 2, 4, 1, 5, 3, 5, 4])
    ids = torch.randint(4, vocab, (b, lp + r), generator=g)
    if grouped:
        prompt_len[1::2] = prompt_len[0::2]
        ids[1::2, :lp] = ids[0::2, :lp]
    mask = torch.zeros(b, lp + r, dtype=torch.long)
    for i in range(b):
        mask[i, lp - prompt_len[i]: lp + resp_len[i]] = 1
    ids = torch.where(mask.bool(), ids, pad_id)
    response_mask = mask[:, lp:].clone()
    batch = DataProto(tensors={"input_ids": ids, "attention_mask": mask, "responses": ids[:, lp:].clone(),
                               "response_mask": response_mask},
                      meta={"temperature": 1.0, "rollout_n": 2})
    advantages = torch.randn(b, r, generator=g) * response_mask
    return batch, advantages


def parse_args():
    import argparse

    p = argparse.ArgumentParser()
    for name in ("rank", "world", "tp"):
        p.add_argument(name, type=int)
    for name in ("rdzv", "out", "tok"):
        p.add_argument(name)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--critic", action="store_true", help="a critic beside the actor, at the same layout")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--sp", action="store_true")
    p.add_argument("--init-from")
    p.add_argument("--load-from")
    p.add_argument("--grouped", action="store_true", help="rows share prompts in pairs (fixed_batch)")
    p.add_argument("--own-prompts", action="store_true", help="every row runs its own copy of its prompt")
    a = p.parse_args()
    return a


def actor_config(a):
    from tandem.config import load_config

    overrides = [
        f"actor_rollout_ref.model.tokenizer_path={a.tok}", "actor_rollout_ref.model.init_std=0.1",
        f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={a.tp}", f"services.actor.world_size={a.world}",
        f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={a.pp}",
        f"actor_rollout_ref.actor.megatron.sequence_parallel={a.sp}",
        f"actor_rollout_ref.actor.megatron.expert_model_parallel_size={a.ep}",
        f"actor_rollout_ref.actor.megatron.context_parallel_size={a.cp}",
        "actor_rollout_ref.rollout.n=2", "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 2 prompts x n=2 = 4 rows per optimizer step
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
        "actor_rollout_ref.actor.optim.lr=1e-4", "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "actor_rollout_ref.actor.entropy_coeff=0.01", *a.set, *os.environ.get("ACTOR_RANK_OVERRIDES", "").split()]
    if a.critic:  # the critic at the actor's layout (the same megatron parallel_state)
        overrides += [*(f"critic.megatron.{k}_parallel_size={v}" for k, v in (
            ("tensor_model", a.tp), ("pipeline_model", a.pp), ("context", a.cp))),
            f"critic.megatron.sequence_parallel={a.sp}", f"services.critic.world_size={a.world}",
            "critic.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=3"]
    if a.pp == 1:
        return load_config(None, overrides)
    # the run-level check wants a generation layout for PP > 1; the actor alone runs it
    from omegaconf import OmegaConf

    from tandem.config import TandemConfig

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TandemConfig), OmegaConf.from_dotlist(overrides)))


def exercise(actor, a, batch, advantages) -> dict:
    """Rank 0: load or update, then what the tests compare (log-probs, HF export, TP=1 weights)."""
    result = {}
    if a.load_from:
        actor.load(a.load_from)
    else:
        if a.init_from:
            actor.load(a.init_from)
        else:
            actor.save(os.path.join(a.out, "init"))
        old = actor.compute_log_prob(batch, calculate_entropy=True)
        result["before"] = old["old_log_probs"]
        train = batch.union(old.select(tensor_keys=["old_log_probs"]))
        train.tensors["advantages"] = advantages
        update = actor.update_actor(train)
        result["metrics"], result["update_rows"] = update.metrics, update.update_rows
        if update.old_log_probs is not None:  # the first update_rows rows' from the update's own forward
            result["update_old"] = update.old_log_probs["old_log_probs"]
    result["log_probs"] = actor.compute_log_prob(batch)["old_log_probs"]
    if a.pp == 1:  # (HF export gathers TP shards only; a PP run's weights are compared after a reload)
        actor.export_hf(os.path.join(a.out, "hf"))
        result["weights"] = actor.export_weights()  # the TP=1 layout a standalone rollout loads
    if not a.load_from:
        actor.save(os.path.join(a.out, "ckpt"))
    return result


def exercise_critic(critic, a, batch, advantages) -> dict:
    """Rank 0: the critic's values, one update towards made-up returns, values after; a checkpoint."""
    if a.load_from:
        critic.load(os.path.join(a.load_from, "critic"), trunk_only=False)
        return {"values_after": critic.compute_values(batch)["values"]}
    values = critic.compute_values(batch)["values"]
    train = batch.union(DataProto(tensors={"values": values, "returns": values + advantages}))
    metrics = critic.update_critic(train)
    critic.save(os.path.join(a.out, "ckpt", "critic"))
    return {"values": values, "critic_metrics": metrics, "values_after": critic.compute_values(batch)["values"]}


def main() -> int:
    a = parse_args()
    from transformers import AutoTokenizer

    from tandem.parallel.layout import ParallelConfig, init_distributed
    from tandem.services.actor.front import ActorFront
    from tandem.services.actor.worker import ActorWorker
    from tandem.serving.rank_group import RankGroup

    cfg = actor_config(a)
    init_distributed(ParallelConfig.of(cfg.actor_rollout_ref.actor.megatron), a.rank, a.world, a.rdzv,
                     seed=1)
    tokenizer = AutoTokenizer.from_pretrained(a.tok)
    worker = ActorWorker(cfg, len(tokenizer))
    worker.share_prompts = worker.share_prompts and not a.own_prompts
    norms = [p for n, p in worker.policy.named_parameters() if "layernorm" in n]
    assert worker.policy.config.sequence_parallel == a.sp and all(p.sequence_parallel == a.sp for p in norms)
    targets = {"actor": worker}
    if a.critic:
        from tandem.services.critic.worker import CriticWorker

        targets["critic"] = CriticWorker(cfg, len(tokenizer))
    group = RankGroup(targets)
    if not group.is_front:
        group.follow()
        return 0
    batch, advantages = fixed_batch(len(tokenizer), tokenizer.pad_token_id, a.grouped)
    try:
        result = exercise(ActorFront(group, worker), a, batch, advantages)
        if a.critic:
            from tandem.services.critic.front import CriticFront

            result.update(exercise_critic(CriticFront(group, targets["critic"]), a, batch, advantages))
    finally:
        group.stop()
    torch.save(result, os.path.join(a.out, "result.pt"))
    return 0


if __name__ == "__main__":
    exit_process(main())  # without the interpreter's teardown (seconds per rank)
