"""Micro-batches by a token budget (verl's use_dynamic_bsz, tandem/train/microbatch.py): the fewest runs of
consecutive rows within the budget, balanced; the config keys that choose it and their checks; and an
actor update on token-budget micro-batches equal to one on row micro-batches."""
import itertools
import types

import pytest
import torch

from tandem.data.batch import DataProto
from tandem.train.microbatch import MicroBatching, actor_split, critic_split, micro_batches, ref_split, token_runs


def runs_of(lengths, sizes):
    out, i = [], 0
    for n in sizes:
        out.append(lengths[i:i + n])
        i += n
    assert i == len(lengths)
    return out


def best(lengths, budget):
    """(fewest runs, smallest largest run at that count) by trying every cut."""
    found = []
    for cuts in range(len(lengths)):
        for at in itertools.combinations(range(1, len(lengths)), cuts):
            bounds = [0, *at, len(lengths)]
            loads = [sum(lengths[a:b]) for a, b in zip(bounds, bounds[1:])]
            if max(loads) <= budget:
                found.append((len(loads), max(loads)))
        if found:
            return min(found)
    raise AssertionError("no split")


@pytest.mark.parametrize("seed", range(40))
def test_token_runs_are_the_fewest_and_balanced(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 30, (int(torch.randint(1, 10, (), generator=g)),), generator=g).tolist()
    budget = max(lengths) + int(torch.randint(0, 40, (), generator=g))
    runs = runs_of(lengths, token_runs(lengths, budget))
    assert all(sum(r) <= budget and r for r in runs)
    assert (len(runs), max(sum(r) for r in runs)) == best(lengths, budget)


def test_token_runs_edge_cases():
    assert token_runs([], 10) == []
    assert token_runs([10, 10, 10], 10) == [1, 1, 1]
    assert token_runs([3, 3, 3, 3], 100) == [4]
    assert token_runs([5, 1, 1, 1, 1, 1], 6) == [1, 5]  # greedy alone gives the same here; balanced stays valid
    assert token_runs([4, 4, 4, 1], 8) == [2, 2]  # not [2, 1, 1]: fewest, then balanced (8 and 5)
    with pytest.raises(ValueError, match="a row has 11 tokens, more than the micro-batch token budget 10"):
        token_runs([3, 11], 10)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        MicroBatching(0)


def test_micro_batches_by_tokens_keep_the_rows_in_order():
    lengths = [5, 2, 7, 1, 6, 3]
    mask = torch.tensor([[1] * n + [0] * (8 - n) for n in lengths])
    batch = DataProto(tensors={"attention_mask": mask, "row": torch.arange(6)})
    parts = micro_batches(batch, MicroBatching(10))
    assert [p["attention_mask"].sum().item() for p in parts] == [7, 8, 9]
    assert torch.equal(torch.cat([p["row"] for p in parts]), torch.arange(6))
    assert [len(p) for p in micro_batches(batch, 4)] == [4, 2]  # rows, as before


def config(*extra):
    from tandem.config import load_config

    return load_config(None, ["data.max_prompt_length=16", "data.max_response_length=6", *extra])


def test_the_keys_choose_the_split_and_the_reference_follows_the_actor():
    cfg = config()  # nothing set: the actor's and the reference's budget, the longest row at least
    arr = cfg.actor_rollout_ref
    assert actor_split(arr.actor) == MicroBatching(32768) == ref_split(arr.ref, arr.actor) and critic_split(cfg.critic) == 64
    cfg = config("data.max_response_length=40000", "actor_rollout_ref.model.max_position_embeddings=40016")
    assert actor_split(cfg.actor_rollout_ref.actor) == MicroBatching(40016)
    cfg = config("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8")  # a row count set: rows, as in verl
    assert actor_split(cfg.actor_rollout_ref.actor) == 8 and ref_split(cfg.actor_rollout_ref.ref, cfg.actor_rollout_ref.actor) == 64
    from tandem.config.resolve import resolve

    a = config().actor_rollout_ref.actor  # experts in parallel (an MoE model's config): rows
    a.use_dynamic_bsz, a.ppo_micro_batch_size_per_gpu, a.megatron.expert_model_parallel_size = None, None, 2
    resolve(types.SimpleNamespace(actor_rollout_ref=types.SimpleNamespace(actor=a), data=config().data))
    assert actor_split(a) == 256
    cfg = config("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=500",
                 "critic.use_dynamic_bsz=true", "critic.forward_max_token_len_per_gpu=900")
    arr = cfg.actor_rollout_ref
    assert actor_split(arr.actor) == MicroBatching(500) and ref_split(arr.ref, arr.actor) == MicroBatching(500)
    assert critic_split(cfg.critic) == MicroBatching(32768) and critic_split(cfg.critic, forward=True) == MicroBatching(900)
    cfg = config("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false")
    assert ref_split(cfg.actor_rollout_ref.ref, cfg.actor_rollout_ref.actor) == 64
    cfg = config("actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true", "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=77",
                 "actor_rollout_ref.actor.use_dynamic_bsz=false")
    assert ref_split(cfg.actor_rollout_ref.ref, cfg.actor_rollout_ref.actor) == MicroBatching(77)
    assert actor_split(cfg.actor_rollout_ref.actor) == 256


@pytest.mark.parametrize("extra, message", [
    (["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=21"],
     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu: 21 tokens cannot hold a row of data.max_prompt_length "
     "+ data.max_response_length = 22 tokens"),
    (["actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true", "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=5"],
     "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu: 5 tokens cannot hold"),
    (["critic.use_dynamic_bsz=true", "critic.forward_max_token_len_per_gpu=10"],
     "critic.forward_max_token_len_per_gpu: 10 tokens cannot hold"),
    (["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=0"],
     "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu: must be >= 1"),
])
def test_bad_budgets_name_their_key(extra, message):
    from tandem.config import ConfigError

    with pytest.raises(ConfigError, match=message.replace("+", r"\+")):
        config(*extra)


def test_token_budgets_with_expert_parallelism_are_refused():
    from tandem.config import ConfigError
    from tandem.config.checks.micro_batches import check_micro_batches

    cfg = config()
    cfg.actor_rollout_ref.actor.use_dynamic_bsz = True
    cfg.actor_rollout_ref.actor.megatron.expert_model_parallel_size = 2
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.use_dynamic_bsz: token budgets with "
                                          "expert_model_parallel_size=2"):
        check_micro_batches(cfg)


def test_verl_rollout_keys_are_accepted_as_the_actors():
    from tandem.config import load_config_with_notices

    cfg, translation = load_config_with_notices(None, ["actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
                                                   "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096"])
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 32768  # the actor's own, not the rollout's 4096
    assert any("log_prob_use_dynamic_bsz" in n and "actor.use_dynamic_bsz" in n for n in translation.notices)


def test_an_update_on_token_budgets_equals_one_on_rows(megatron_dist, arithmetic_tokenizer, monkeypatch):
    """The same batch through two fresh actors, 3 rows per micro-batch against a 30-token budget: the
    same old and reference log-probs and update (metrics, weights) up to float rounding, in a different
    number of forwards."""
    from tandem.train import schedule
    from tests.unit.test_actor_worker import generate, make_worker, training_batch, weights

    calls = []
    run = schedule.run_schedule
    monkeypatch.setattr("tandem.train.step.run_schedule",
                        lambda model, mbs, *a, **k: calls.append([len(m) for m in mbs]) or run(model, mbs, *a, **k))
    out = {}
    for name, extra in (("rows", []), ("tokens", ["actor_rollout_ref.actor.use_dynamic_bsz=true",
                                                  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30",
                                                  "data.max_prompt_length=10", "data.max_response_length=6"])):
        torch.manual_seed(0)
        worker = make_worker(arithmetic_tokenizer, *extra)
        seq = generate(worker, arithmetic_tokenizer)
        calls.clear()
        batch = training_batch(worker, seq)
        ref = worker.compute_ref_log_prob(seq)["ref_log_prob"]
        metrics = worker.update_actor(batch).metrics
        out[name] = (seq, batch["old_log_probs"], ref, metrics, weights(worker), list(calls))
    (s1, old1, ref1, m1, w1, c1), (s2, old2, ref2, m2, w2, c2) = out["rows"], out["tokens"]
    assert torch.equal(s1["input_ids"], s2["input_ids"]) and torch.equal(s1["responses"], s2["responses"])
    assert c1 == [[3, 3, 2]] * 3, c1  # old log-probs, reference, update: 8 rows as 3 + 3 + 2
    assert len(c2) == 3 and all(len(c) > 3 and sum(c) == 8 for c in c2), c2  # rows of 11-16 tokens: 2 or fewer a run
    torch.testing.assert_close(old1, old2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ref1, ref2, rtol=1e-5, atol=1e-6)
    assert m1["actor/ppo_kl"] == m2["actor/ppo_kl"] == 0.0  # one mini-batch: the old pass split as the update is
    for k in ("actor/pg_loss", "actor/grad_norm"):
        assert m1[k] == pytest.approx(m2[k], rel=1e-4, abs=1e-7), k
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=1e-4, atol=1e-6)


def test_the_critic_on_token_budgets_equals_the_critic_on_rows(megatron_dist, arithmetic_tokenizer, monkeypatch):
    """Values and an update through the critic's front door: 3 rows per micro-batch against a 14-token budget."""
    from tandem.config import load_config
    from tandem.parallel import device
    from tandem.services.critic.front import CriticFront
    from tandem.services.critic.worker import CriticWorker
    from tandem.serving.rank_group import RankGroup
    from tandem.train import schedule

    sizes = []
    run = schedule.run_schedule
    monkeypatch.setattr("tandem.train.step.run_schedule",
                        lambda model, mbs, *a, **k: sizes.append([len(m) for m in mbs]) or run(model, mbs, *a, **k))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(arithmetic_tokenizer), (6, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[:, :2] = torch.tensor([[0, 0], [0, 1], [1, 1], [0, 0], [0, 1], [1, 1]])  # left padding: 7-9 tokens a row
    batch = DataProto(tensors={"input_ids": ids * mask, "attention_mask": mask, "responses": ids[:, 5:],
                               "response_mask": torch.ones_like(ids[:, 5:])}, meta={"rollout_n": 2})
    returns, out = torch.randn(6, 4, generator=g), {}
    for name, extra in (("rows", ["critic.ppo_micro_batch_size_per_gpu=3"]),
                        ("tokens", ["critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=14",
                                    "critic.forward_max_token_len_per_gpu=20"])):
        cfg = load_config(None, [f"actor_rollout_ref.model.tokenizer_path={arithmetic_tokenizer.name_or_path}",
                                 "actor_rollout_ref.model.hidden_size=64", "actor_rollout_ref.model.intermediate_size=128",
                                 "algorithm.adv_estimator=gae", "data.max_prompt_length=5", "data.max_response_length=4",
                                 "actor_rollout_ref.rollout.n=2", "critic.ppo_mini_batch_size=3", *extra])
        device.manual_seed(1)
        worker = CriticWorker(cfg, len(arithmetic_tokenizer))
        front = CriticFront(RankGroup({"critic": worker}), worker)
        sizes.clear()
        values = front.compute_values(batch)["values"]
        train = batch.union(DataProto(tensors={"values": values, "returns": returns}))
        out[name] = (values, front.update_critic(train), list(sizes))
    (v1, m1, s1), (v2, m2, s2) = out["rows"], out["tokens"]
    assert s1 == [[3, 3], [3, 3]] and s2 == [[2, 2, 2], [1] * 6], (s1, s2)  # values, then the update
    torch.testing.assert_close(v1, v2, rtol=1e-5, atol=1e-6)
    assert m1["critic/vf_loss"] == pytest.approx(m2["critic/vf_loss"], rel=1e-4)
    assert m1["critic/grad_norm"] == pytest.approx(m2["critic/grad_norm"], rel=1e-4)


def test_a_row_over_the_budget_is_refused_before_any_rank_runs(megatron_dist, arithmetic_tokenizer):
    """A request whose rows do not fit the budget (a client not bound by data.max_*_length): INVALID_ARGUMENT
    naming the row, for the log-prob passes and the update alike, with the weights and version unchanged."""
    from tandem.rpc.errors import InvalidArgument
    from tests.unit.test_actor_worker import generate, make_worker, weights

    worker = make_worker(arithmetic_tokenizer, "actor_rollout_ref.actor.use_dynamic_bsz=true",
                         "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=11", "data.max_prompt_length=5",
                         "data.max_response_length=6")
    seq = generate(worker, arithmetic_tokenizer)
    longest = int(seq["attention_mask"].sum(1).max())
    assert longest > 11
    message = rf"attention_mask: row \d+ has {longest} tokens, more than the micro-batch token budget of 11"
    for call in (lambda: worker.compute_log_prob(seq), lambda: worker.compute_log_prob(seq, with_reference=True),
                 lambda: worker.compute_ref_log_prob(seq)):
        with pytest.raises(InvalidArgument, match=message):
            call()
    before = weights(worker)
    batch = seq.union(DataProto(tensors={"old_log_probs": torch.zeros(seq["responses"].shape),
                                         "advantages": torch.ones(seq["responses"].shape)}))
    with pytest.raises(InvalidArgument, match=message):
        worker.update_actor(batch)
    assert worker.weights_version == 0
    assert all(torch.equal(v, weights(worker)[k]) for k, v in before.items())
