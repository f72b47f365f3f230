"""A colocated rollout at generation TP=1 behind an actor at TP=2 or PP=2 (2 gloo ranks):
each rank's TP=1 copy, synced from the training shards (and stages) before every generation,
generates what a TP=1 model loaded from the actor's exported weights generates, and at TP=2
what the TP=2 modules generate, before and after a PPO update."""
import sys
from pathlib import Path

import pytest
import torch

from tandem.parallel.layout import local_tcp_rendezvous

KEYS = ("prompts", "responses", "response_mask", "input_ids", "attention_mask")


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_tp1_replicas_follow_the_sharded_actor(tmp_path, arithmetic_tokenizer_dir, run_ranks, layout):
    script = str(Path(__file__).parents[1] / "helpers" / "replica_rank.py")
    rendezvous = local_tcp_rendezvous()
    run_ranks([[sys.executable, script, str(r), rendezvous, str(tmp_path), arithmetic_tokenizer_dir,
                layout] for r in range(2)], timeout=600)
    result = torch.load(tmp_path / "result.pt", weights_only=False)
    assert result["syncs"] == 2
    refs = ["reference"] + (["shared"] if layout == "tp2" else [])
    for ref in refs:
        for when, (want, got) in enumerate(zip(result[ref], result["replica"])):
            for k in KEYS:
                assert torch.equal(got[k], want[k]), (ref, when, k)
            # fp32: other batch compositions (and TP=2's split sums) add in another order
            torch.testing.assert_close(got["rollout_log_probs"], want["rollout_log_probs"], atol=5e-5, rtol=0)
    before, after = result["reference"]
    assert before["response_mask"].sum() >= 12  # 6 prompts, not all stopping at once
    assert not torch.allclose(before["rollout_log_probs"], after["rollout_log_probs"], atol=1e-3), \
        "the update did not move the policy: the sync would go untested"
