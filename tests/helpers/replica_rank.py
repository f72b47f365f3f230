"""One rank of tests/multirank/test_replica_rollout.py: an actor at TP=2 or PP=2 (2 gloo
ranks) whose colocated rollout generates on TP=1 copies (tandem/rollout/replica.py), before
and after a PPO update. References, in the same process group: a TP=1 model on rank 0 loaded
from the actor's export_weights, and at TP=2 the TP=2 modules themselves.

usage: python replica_rank.py RANK RENDEZVOUS OUT TOKENIZER LAYOUT (tp2 | pp2)
Rank 0 writes OUT/result.pt: lists of generations (before, after) per source, and the syncs.
"""
import os
import sys

import torch

from tandem.process_exit import exit_process


def main() -> int:
    rank, rdzv, out, tok, layout = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    from actor_rank import fixed_batch
    from transformers import AutoTokenizer

    from tandem.config import load_config
    from tandem.data.batch import DataProto
    from tandem.generation.engine import left_pad
    from tandem.generation.sampling import SamplingParams
    from tandem.models.build import build_gpt_model
    from tandem.parallel.layout import ParallelConfig, init_distributed
    from tandem.rollout.replica import ReplicaRollout
    from tandem.rollout.worker import RolloutWorker
    from tandem.services.actor import hybrid
    from tandem.services.actor.front import ActorFront
    from tandem.services.actor.worker import ActorWorker
    from tandem.serving.rank_group import RankGroup
    from tandem.serving.rollout_front import RolloutFront

    tp, pp = (2, 1) if layout == "tp2" else (1, 2)
    cfg = load_config(None, [
        f"actor_rollout_ref.model.tokenizer_path={tok}", "actor_rollout_ref.model.init_std=0.3",
        f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}",
        f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={pp}", "services.actor.world_size=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.n=2",
        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.optim.lr_warmup_steps=0"])
    init_distributed(ParallelConfig.of(cfg.actor_rollout_ref.actor.megatron), rank, 2, rdzv, seed=1)
    tokenizer = AutoTokenizer.from_pretrained(tok)
    actor = ActorWorker(cfg, len(tokenizer))
    colocated = hybrid.colocated_rollout_worker(actor, tokenizer, 64, False, generation_tp=1)
    replica = colocated.engine
    assert isinstance(replica, ReplicaRollout)
    targets = {"actor": actor, "replica": colocated}
    if tp > 1:
        targets["shared"] = hybrid.colocated_rollout_worker(actor, tokenizer, 64, False, generation_tp=None)
    group = RankGroup(targets)
    if not group.is_front:
        group.follow()
        return 0
    # the copy is the whole model on one rank
    names = dict(replica.model.named_parameters())
    assert len([n for n in names if n.endswith("linear_qkv.weight")]) == actor.shape.num_hidden_layers
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert names[qkv].shape[0] == tp * dict(actor.policy.named_parameters())[qkv].shape[0]
    texts = ["12+7=", "905+88=", "3+4=", "640+521=", "8+8=", "77+5="]  # 6 prompts: 3 per replica
    rows = [[tokenizer.bos_token_id] + tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    prompts = DataProto(tensors={"input_ids": ids, "attention_mask": mask})
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    fronts = {k: RolloutFront(group, actor.vocab_size, tokenizer.pad_token_id, target=k) for k in targets if k != "actor"}
    reference = RolloutWorker(build_gpt_model(actor.shape, replica=True).eval(), pad_id=tokenizer.pad_token_id,
                              eos_id=tokenizer.eos_token_id, vocab_size=actor.vocab_size, max_batch_size=64)
    result = {k: [] for k in [*fronts, "reference"]}
    try:
        front = ActorFront(group, actor)
        for step in range(2):  # before and after an update: the copies must follow the policy
            for k, f in fronts.items():
                result[k].append(f.generate_sequences(prompts, greedy))
            reference.load_weights(front.export_weights(), step)
            result["reference"].append(reference.generate_sequences(prompts, greedy))
            batch, advantages = fixed_batch(len(tokenizer), tokenizer.pad_token_id)
            train = batch.union(front.compute_log_prob(batch))
            train.tensors["advantages"] = advantages * 10
            front.update_actor(train)
        result["syncs"] = replica.syncs
    finally:
        group.stop()
    torch.save(result, os.path.join(out, "result.pt"))
    return 0


if __name__ == "__main__":
    exit_process(main())  # without the interpreter's teardown (seconds per rank)
