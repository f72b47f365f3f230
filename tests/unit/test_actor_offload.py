"""verl's offload keys on the actor (and critic), in process: the same weights with every key on
as with every key off (fp32, two GRPO-shaped steps through the colocated rollout), which tensors
are where after each phase, optimizer state back before a step, and checkpoints that cross between
offload on and off. On CPU "host memory" is a second CPU buffer: the moves and their bookkeeping
are real, the memory saving is not (bench/offload.py measures that on a GPU)."""
import pytest
import torch

from tandem.data.batch import DataProto
from tandem.generation.engine import left_pad
from tandem.generation.sampling import SamplingParams

TEXTS = ["12+7=", "905+88=", "3+4=", "640+521="]
N = 2
OFFLOAD_ALL = ["actor_rollout_ref.actor.megatron.param_offload=true",
               "actor_rollout_ref.actor.megatron.grad_offload=true",
               "actor_rollout_ref.actor.megatron.optimizer_offload=true",
               "actor_rollout_ref.ref.megatron.param_offload=true"]


def make_actor(tokenizer, *extra):
    """(ActorFront over one rank, the colocated rollout target) as services/actor/__main__.py builds them."""
    from tandem.config import load_config
    from tandem.parallel import device
    from tandem.services.actor import hybrid
    from tandem.services.actor.front import ActorFront

    cfg = load_config(None, [
        f"actor_rollout_ref.model.tokenizer_path={tokenizer.name_or_path}",
        "actor_rollout_ref.model.init_std=0.3", "actor_rollout_ref.model.hidden_size=64",
        "actor_rollout_ref.model.intermediate_size=128", "data.train_batch_size=4",
        f"actor_rollout_ref.rollout.n={N}", "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 2 steps per update
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3", "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.rollout.free_cache_engine=true", *extra])
    device.manual_seed(1)  # the same initial weights for every actor of a test
    front = ActorFront.in_process(cfg, len(tokenizer))
    return front, hybrid.colocated_rollout_worker(front.local, tokenizer, 64, free_cache_engine=True)


def prompts(tokenizer) -> DataProto:
    rows = [[tokenizer.bos_token_id] + tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    return DataProto(tensors={"input_ids": ids, "attention_mask": mask})


def grpo_step(front, rollout, tokenizer, seed: int, seen: dict | None = None, pair: bool = False) -> dict:
    """Generate -> old and reference log-probs -> update, as a colocated step runs them; `seen`
    collects the actor's memory.where() after each phase. pair: both log-probs in one call (the
    reference's copies in while the policy's pass runs), as the controller asks for them."""
    memory = front.local.memory
    gen = rollout.generate_sequences(prompts(tokenizer), SamplingParams(max_new_tokens=6, temperature=0.9, n=N,
                                                                        seed=seed))
    record = (lambda name: seen.setdefault(name, []).append(memory.where())) if seen is not None else (lambda n: None)
    record("generate")
    seq = gen.select(tensor_keys=["input_ids", "attention_mask", "responses", "response_mask"])
    seq.meta = {"temperature": 0.9, "rollout_n": N}
    if pair:
        batch = seq.union(front.compute_log_prob(seq, with_reference=True))
        record("log_probs and ref_log_probs")
    else:
        batch = seq.union(front.compute_log_prob(seq))
        record("log_probs")
        batch = batch.union(front.compute_ref_log_prob(seq))
        record("ref_log_probs")
    batch.tensors["advantages"] = torch.randn(seq["responses"].shape, generator=torch.Generator().manual_seed(seed))
    metrics = front.update_actor(batch).metrics
    record("train")
    return metrics


def state_bytes(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def test_offload_on_and_off_train_to_the_same_weights(megatron_dist, arithmetic_tokenizer):
    plain, plain_rollout = make_actor(arithmetic_tokenizer)
    off, off_rollout = make_actor(arithmetic_tokenizer, *OFFLOAD_ALL)
    seen: dict = {}
    for seed in (1, 2):
        a = grpo_step(plain, plain_rollout, arithmetic_tokenizer, seed)
        b = grpo_step(off, off_rollout, arithmetic_tokenizer, seed, seen, pair=seed == 2)
        assert a["actor/pg_loss"] == b["actor/pg_loss"] and a["actor/grad_norm"] == b["actor/grad_norm"]
    for (name, x), (_, y) in zip(plain.export_weights().items(), off.export_weights().items()):
        assert torch.equal(x, y), name
    with off.local.memory.phase("ref_log_probs"):  # in host memory after the update: bring it back to read it
        plain_ref, off_ref = plain.local.ref.state_dict(), off.local.ref.state_dict()
        assert all(torch.equal(plain_ref[k], off_ref[k]) for k in plain_ref if not k.endswith("_extra_state"))
    # where each group was after each phase (the same both steps)
    host, dev = "host", "device"
    groups = ("policy", "grads", "optimizer", "ref", "kv_cache")
    want = {"generate": dict(zip(groups, (dev, host, host, host, dev))),
            "log_probs": dict(zip(groups, (dev, host, host, host, host))),
            "ref_log_probs": dict(zip(groups, (host, host, host, dev, host))),
            "train": dict(zip(groups, (dev, dev, dev, host, host)))}
    want["log_probs and ref_log_probs"] = want["ref_log_probs"]
    for phase, where in want.items():
        assert seen[phase] == [where] * (2 if phase in ("generate", "train") else 1), phase
    # the memory metrics come with every update (0 on CPU for the device, the process's RSS for the host)
    assert a["perf/max_memory_allocated_gb"] == 0.0 and a["perf/max_memory_reserved_gb"] == 0.0
    assert a["perf/cpu_memory_used_gb"] > 0.1


def test_each_phase_leaves_the_tensors_where_it_says_and_loses_nothing(megatron_dist, arithmetic_tokenizer):
    front, rollout = make_actor(arithmetic_tokenizer, *OFFLOAD_ALL)
    actor = front.local
    grpo_step(front, rollout, arithmetic_tokenizer, seed=1)  # Adam state exists after the first update
    actor.memory.enter("checkpoint")  # policy, reference and optimizer state all on the device
    opt = actor.optimizer
    policy = list(actor.policy.parameters())
    moments = [t for t in opt.state_tensors() if t.dim() > 0 and not any(t is p for p in policy)]
    assert moments, "no Adam moments found"
    saved = [t.clone() for t in moments]
    grad_buffers = [b.grad_data for b in actor.ddp.buffers]
    ref = list(actor.ref.parameters())
    ref_saved = [p.detach().clone() for p in ref]

    actor.memory.enter("generate")
    assert state_bytes(moments) == 0 and state_bytes(grad_buffers) == 0 and state_bytes(ref) == 0
    assert state_bytes(policy) > 0
    assert actor.memory.groups["optimizer"].stash.nbytes_on_host >= sum(t.numel() * 4 for t in moments)
    actor.memory.enter("ref_log_probs")
    assert state_bytes(policy) == 0 and state_bytes(ref) > 0
    assert all(torch.equal(p.detach(), s) for p, s in zip(ref, ref_saved))
    actor.memory.enter("train")
    # back before a step: the same tensor objects with the same values, and the grads zeroed
    assert all(torch.equal(t, s) for t, s in zip(moments, saved))
    assert all(t is u for t, u in zip(moments, [t for t in opt.state_tensors() if t.dim() > 0
                                                and not any(t is p for p in policy)]))
    assert all(b.untyped_storage().nbytes() > 0 and not b.any() for b in grad_buffers)
    assert state_bytes(ref) == 0 and opt.before_step is not None  # the step will wait for the copies
    grpo_step(front, rollout, arithmetic_tokenizer, seed=2)  # and training goes on from there
    assert opt.before_step is None and opt.steps == 4
    # only read since it came back, the reference leaves without a copy; once a phase may write it
    # (reference := policy), it is copied out again, and its new weights are what comes back
    stash, copied = actor.memory.groups["ref"].stash, []
    offload = stash.offload
    stash.offload = lambda *a, **k: copied.append(offload(*a, **k)) or copied[-1]
    actor.memory.enter("ref_log_probs")
    actor.memory.enter("train")
    actor.set_reference()
    with torch.no_grad():
        new_ref = [p.detach().clone() for p in actor.ref.parameters()]
    actor.memory.enter("train")
    actor.memory.enter("ref_log_probs")
    assert copied[0] == 0 and copied[1] == sum(p.numel() * p.element_size() for p in ref)
    assert not all(torch.equal(n, s) for n, s in zip(new_ref, ref_saved))
    assert all(torch.equal(p.detach(), n) for p, n in zip(ref, new_ref))


@pytest.mark.parametrize("save_offloaded", [True, False])
def test_a_checkpoint_crosses_between_offload_on_and_off(megatron_dist, arithmetic_tokenizer, tmp_path,
                                                         save_offloaded):
    """Saved with offload on (while the optimizer state is in host memory) loads with it off, and
    the reverse; the next update is the same as the saving worker's."""
    keys_save, keys_load = (OFFLOAD_ALL, []) if save_offloaded else ([], OFFLOAD_ALL)
    saver, saver_rollout = make_actor(arithmetic_tokenizer, *keys_save)
    grpo_step(saver, saver_rollout, arithmetic_tokenizer, seed=1)
    saver_rollout.generate_sequences(prompts(arithmetic_tokenizer), SamplingParams(max_new_tokens=2, greedy=True))
    path = saver.save(str(tmp_path / "actor"))
    loader, loader_rollout = make_actor(arithmetic_tokenizer, *keys_load, "actor_rollout_ref.model.init_std=0.02")
    loader.local.memory.enter("generate")  # state out in host memory when the load comes
    assert loader.load(path) == 1
    for (name, x), (_, y) in zip(saver.export_weights().items(), loader.export_weights().items()):
        assert torch.equal(x, y), name
    a = grpo_step(saver, saver_rollout, arithmetic_tokenizer, seed=2)
    b = grpo_step(loader, loader_rollout, arithmetic_tokenizer, seed=2)
    assert a["actor/grad_norm"] == b["actor/grad_norm"]
    for (name, x), (_, y) in zip(saver.export_weights().items(), loader.export_weights().items()):
        assert torch.equal(x, y), name


def test_critic_offload_leaves_the_gpu_after_each_call_and_trains_the_same(megatron_dist, arithmetic_tokenizer):
    from tandem.config import load_config
    from tandem.parallel import device
    from tandem.services.critic.worker import CriticWorker

    def critic(*extra):
        cfg = load_config(None, [f"actor_rollout_ref.model.tokenizer_path={arithmetic_tokenizer.name_or_path}",
                                 "actor_rollout_ref.model.hidden_size=64", "actor_rollout_ref.model.intermediate_size=128",
                                 "algorithm.adv_estimator=gae", *extra])
        device.manual_seed(1)
        return CriticWorker(cfg, len(arithmetic_tokenizer))

    keys = ["critic.megatron.param_offload=true", "critic.megatron.grad_offload=true",
            "critic.megatron.optimizer_offload=true"]
    plain, off = critic(), critic(*keys)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(arithmetic_tokenizer), (4, 9), generator=g)
    batch = DataProto(tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids),
                               "responses": ids[:, 5:], "response_mask": torch.ones_like(ids[:, 5:])},
                      meta={"loss_units": 16, "tokens": 36})
    for _ in range(2):
        values = [w.values([batch], 3)[0]["values"] for w in (plain, off)]
        assert torch.equal(values[0], values[1])
        assert off.memory.where() == {"params": "host", "grads": "host", "optimizer": "host"}
        assert all(p.untyped_storage().nbytes() == 0 for p in off.model.parameters())
        train = batch.union(DataProto(tensors={"values": values[0], "returns": torch.randn(4, 4, generator=g)}))
        metrics = [w.update([train]) for w in (plain, off)]
        assert metrics[0]["steps"]["critic/grad_norm"] == metrics[1]["steps"]["critic/grad_norm"]
        assert "perf/critic/cpu_memory_used_gb" in metrics[1]["steps"]
    assert plain.memory.where() == {"params": "device", "grads": "device", "optimizer": "device"}
    with off.memory.phase("values"):
        for x, y in zip(plain.model.parameters(), off.model.parameters()):
            assert torch.equal(x, y)


def test_plain_and_distributed_optimizer_checkpoints_do_not_cross_and_say_why(megatron_dist, arithmetic_tokenizer,
                                                                              tmp_path):
    """megatron-core saves the two optimizers' state in different formats: loading one into the other
    is refused before anything changes, naming the key to set."""
    dist = "actor_rollout_ref.actor.megatron.use_distributed_optimizer=true"
    plain, plain_rollout = make_actor(arithmetic_tokenizer)
    grpo_step(plain, plain_rollout, arithmetic_tokenizer, seed=1)
    path = plain.save(str(tmp_path / "plain"))
    other, _ = make_actor(arithmetic_tokenizer, dist)
    before = other.export_weights()
    with pytest.raises(ValueError, match="use_distributed_optimizer must be false to load it"):
        other.load(path)
    assert all(torch.equal(before[k], v) for k, v in other.export_weights().items())


def test_distributed_optimizer_with_offload_resumes_exactly(megatron_dist, arithmetic_tokenizer, tmp_path):
    """megatron's distributed optimizer (one rank) with every offload key: saved while its state is in
    host memory, loaded into a fresh actor whose state is out too, the next step is the uninterrupted one
    (the step counters come back per parameter: a shared one would advance once per parameter)."""
    dist = "actor_rollout_ref.actor.megatron.use_distributed_optimizer=true"
    actor, rollout = make_actor(arithmetic_tokenizer, dist, *OFFLOAD_ALL)
    grpo_step(actor, rollout, arithmetic_tokenizer, seed=1)
    rollout.generate_sequences(prompts(arithmetic_tokenizer), SamplingParams(max_new_tokens=2, greedy=True))
    assert actor.local.memory.where()["optimizer"] == "host"
    path = actor.save(str(tmp_path / "actor"))
    resumed, resumed_rollout = make_actor(arithmetic_tokenizer, dist, *OFFLOAD_ALL, "actor_rollout_ref.model.init_std=0.02")
    resumed.local.memory.enter("generate")
    resumed.load(path)
    a = grpo_step(actor, rollout, arithmetic_tokenizer, seed=2)
    b = grpo_step(resumed, resumed_rollout, arithmetic_tokenizer, seed=2)
    assert a["actor/grad_norm"] == b["actor/grad_norm"]
    for (name, x), (_, y) in zip(actor.export_weights().items(), resumed.export_weights().items()):
        assert torch.equal(x, y), name


def test_an_on_policy_update_runs_in_the_train_phase_and_matches_offload_off(megatron_dist, arithmetic_tokenizer):
    """The on-policy update (no old log-prob pass: the update's own forward gives them) with every key
    on: the same old log-probs and weights as with every key off, and the state where `train` puts it."""
    one_mini = "actor_rollout_ref.actor.ppo_mini_batch_size=4"  # every row in one mini-batch: on-policy
    results = []
    for keys in ([], OFFLOAD_ALL):
        front, rollout = make_actor(arithmetic_tokenizer, *keys, one_mini)
        gen = rollout.generate_sequences(prompts(arithmetic_tokenizer), SamplingParams(max_new_tokens=6, n=N, seed=3))
        seq = gen.select(tensor_keys=["input_ids", "attention_mask", "responses", "response_mask"])
        seq.meta = {"temperature": 1.0, "rollout_n": N}
        batch = seq.union(front.compute_ref_log_prob(seq))
        batch.tensors["advantages"] = torch.randn(seq["responses"].shape, generator=torch.Generator().manual_seed(3))
        metrics, old, own = front.update_actor(batch)
        assert own == len(seq)
        where = front.local.memory.where()  # before the export's own phase
        results.append((metrics, old["old_log_probs"], front.export_weights(), where))
    (m_off, old_off, w_off, _), (m_on, old_on, w_on, where_on) = results
    assert torch.equal(old_off, old_on) and m_off["actor/grad_norm"] == m_on["actor/grad_norm"]
    assert all(torch.equal(w_off[k], w_on[k]) for k in w_off)
    assert where_on == {"policy": "device", "grads": "device", "optimizer": "device", "ref": "host",
                        "kv_cache": "host"}


def test_the_weight_plane_export_survives_the_policy_leaving_the_device(megatron_dist, arithmetic_tokenizer):
    """stage_export at TP=1 hands the weight plane the parameters themselves; with param_offload they
    would be emptied by the next phase that moves the policy out, before the plane reads them: copies."""
    for keys, copied in (([], False), (OFFLOAD_ALL, True)):
        front, _ = make_actor(arithmetic_tokenizer, *keys)
        params = {n: p.detach().clone() for n, p in front.local.policy.named_parameters()}
        exported = front.stage_export()
        front.local.memory.enter("ref_log_probs")  # the policy leaves when its key is on
        storages = {p.untyped_storage().data_ptr() for p in front.local.policy.parameters()}
        assert any(t.untyped_storage().data_ptr() in storages for t in exported.values()) is not copied
        assert all(torch.equal(exported[n], params[n]) for n in exported)


def test_release_drops_the_offload_state(megatron_dist, arithmetic_tokenizer):
    """A Release (the controller service gives the run back) takes the stashed bytes and the spare
    pinned buffers with it, not when the worker object is collected."""
    front, rollout = make_actor(arithmetic_tokenizer, *OFFLOAD_ALL)
    grpo_step(front, rollout, arithmetic_tokenizer, seed=1)
    rollout.generate_sequences(prompts(arithmetic_tokenizer), SamplingParams(max_new_tokens=2, greedy=True))
    stashes = [g.stash for g in front.local.memory.groups.values() if g.stash is not None]
    assert sum(s.nbytes_on_host for s in stashes) > 0 and any(s._spare for s in stashes)  # control
    front.local.release()
    assert sum(s.nbytes_on_host for s in stashes) == 0 and not any(s._spare for s in stashes)
