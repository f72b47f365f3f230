"""The context-parallel split (tandem/models/context_parallel.py) without processes: the zig-zag shares,
the order that puts every rank's rows back, the masks, and the config keys that refuse what is not offered.
The numbers against CP=1 are tests/multirank/test_context_parallel.py's."""
import pytest
import torch

from tandem.config import ConfigError, load_config
from tandem.models.context_parallel import ContextSplit, gather_order


def splits(total, cp, cu, segments=None):
    cu = torch.tensor(cu, dtype=torch.int32)
    return [ContextSplit(total, cp, r, cu, segments) for r in range(cp)]


def test_zig_zag_shares_and_the_order_back():
    ranks = splits(16, 2, [0, 10, 16])  # two sequences, chunks of 4: rank 0 holds 0-3 and 12-15
    assert ranks[0].local.tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert ranks[1].local.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    stacked = torch.cat([s.local for s in ranks])  # what an all-gather of packed indices returns
    assert torch.equal(stacked[ranks[0].order], torch.arange(16))
    kept = torch.tensor([2, 5, 9, 13, 14])  # outputs at kept positions only, each rank's in kept order
    order, width = gather_order(ranks[0], kept)
    rows = [s.local[s.kept_local(kept)] for s in ranks]  # each rank's kept packed indices
    padded = torch.cat([torch.cat([r, r.new_full((width - len(r),), -1)]) for r in rows])
    assert torch.equal(padded[order], kept)


def test_masks_keep_sequences_causal_and_segments():
    (s,) = splits(8, 1, [0, 5, 8], segments=torch.tensor([0, 0, 1, 1, 2, 0, 0, 0]))
    first, mask = s.mask(0, 8, torch.zeros(1))
    allowed = mask == 0
    assert first == 0 and allowed.shape == (8, 8)
    assert allowed[3, :4].tolist() == [True, True, True, True]  # response 1 sees the prompt and itself
    assert allowed[4, :5].tolist() == [True, True, False, False, True]  # response 2 does not see response 1
    assert not allowed[5, :5].any() and allowed[7, 5:].all()  # the next sequence starts afresh
    assert not allowed.triu(1).any()  # causal
    assert s.mask(0, 8, torch.zeros(1))[1] is mask  # one mask per micro-batch, shared by the layers


def test_config_refuses_what_is_not_offered():
    with pytest.raises(ConfigError, match="services.actor.world_size"):
        load_config(None, ["actor_rollout_ref.actor.megatron.context_parallel_size=2"])
    with pytest.raises(ConfigError, match="context_parallel_size"):
        load_config(None, ["actor_rollout_ref.actor.megatron.context_parallel_size=0"])
    cfg = load_config(None, ["actor_rollout_ref.actor.megatron.context_parallel_size=2", "services.actor.world_size=2",
                             "actor_rollout_ref.ref.megatron.context_parallel_size=2"])  # verl's key for the ref
    assert cfg.actor_rollout_ref.actor.megatron.context_parallel_size == 2
