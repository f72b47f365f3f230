"""ActorWorker in process: on-policy first mini-batch, updates, SFT, reference, checkpoints."""
import pytest
import torch

from tandem.data.batch import DataProto
from tandem.generation.engine import left_pad
from tandem.generation.sampling import SamplingParams

SEQ_KEYS = ["input_ids", "attention_mask", "responses", "response_mask"]
TEXTS = ["12+7=", "905+88=", "3+4=", "640+521="]
N = 2


def make_worker(tokenizer, *extra):
    """The actor's front door over a one-rank group (the service's own code path)."""
    from tandem.config import load_config
    from tandem.services.actor.front import ActorFront

    cfg = load_config(None, [
        f"actor_rollout_ref.model.tokenizer_path={tokenizer.name_or_path}",
        "actor_rollout_ref.model.init_std=0.3", "actor_rollout_ref.model.hidden_size=64",
        "actor_rollout_ref.model.intermediate_size=128",
        "data.train_batch_size=4", f"actor_rollout_ref.rollout.n={N}",
        # one mini-batch = 4 prompts x n=2 = 8 rows = the whole batch; 3 micro-batches (3, 3, 2)
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=3",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.shuffle=false",
        "actor_rollout_ref.actor.use_kl_loss=false", "trainer.sft.lr=3e-3", *extra])
    return ActorFront.in_process(cfg, len(tokenizer))


@pytest.fixture
def worker(megatron_dist, arithmetic_tokenizer):
    return make_worker(arithmetic_tokenizer)


def generate(worker, tokenizer, seed=7) -> DataProto:
    from tandem.rollout.worker import RolloutWorker

    rows = [[tokenizer.bos_token_id] + tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    rollout = RolloutWorker(worker.local.policy, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                            vocab_size=worker.vocab_size, max_batch_size=64)
    gen = rollout.generate_sequences(DataProto(tensors={"input_ids": ids, "attention_mask": mask}),
                                     SamplingParams(max_new_tokens=6, temperature=0.9, n=N, seed=seed))
    seq = gen.select(tensor_keys=SEQ_KEYS)
    seq.meta = {"temperature": gen.meta["temperature"], "rollout_n": N}
    return seq


def weights(worker):
    return {k: v.clone() for k, v in worker.export_weights().items()}


def training_batch(worker, seq, seed=0):
    batch = seq.union(worker.compute_log_prob(seq))
    g = torch.Generator().manual_seed(seed)
    batch.tensors["advantages"] = torch.randn(seq["responses"].shape, generator=g)
    return batch


def test_first_minibatch_is_exactly_on_policy(worker, arithmetic_tokenizer):
    seq = generate(worker, arithmetic_tokenizer)
    assert len(seq) == len(TEXTS) * N
    before = weights(worker)
    batch = training_batch(worker, seq)
    first = worker.update_actor(batch)
    metrics = first.metrics
    # ppo_mini_batch_size (4) x rollout n (2) = 8 rows = the whole batch, one epoch: the old
    # log-probs are the update's own forward's, on the weights before it
    assert metrics["actor/ppo_kl"] == 0.0
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    assert metrics["actor/grad_norm"] > 0
    assert worker.weights_version == 1
    after = weights(worker)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "update_actor did not change any weight"
    assert any("decoder.layers" in k for k in changed) and any("output_layer" in k for k in changed)
    # a second update on the same batch: old log-probs are the policy's before each update (verl's
    # recomputed old_log_prob), so they are the new weights' now
    second = worker.update_actor(batch)
    assert second.metrics["actor/ppo_kl"] == 0.0
    assert not torch.equal(second.old_log_probs["old_log_probs"], first.old_log_probs["old_log_probs"])


def test_two_minibatches_second_is_off_policy(megatron_dist, arithmetic_tokenizer):
    """Control for the test above: with 2 mini-batches the averaged ppo_kl includes a
    mini-batch computed after an optimizer step, so it is not 0."""
    w = make_worker(arithmetic_tokenizer, "actor_rollout_ref.actor.ppo_mini_batch_size=2")
    metrics = w.update_actor(training_batch(w, generate(w, arithmetic_tokenizer))).metrics
    assert metrics["actor/ppo_kl"] != 0.0


def test_sft_reduces_loss_on_repeated_batch(worker, arithmetic_tokenizer):
    from tandem.controller.data import Example
    from tandem.controller.sft import sft_batch

    tok = arithmetic_tokenizer
    examples = [Example([tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"], t,
                        str(eval(t[:-1])), "tandem/arithmetic", {}) for t in TEXTS]
    batch = sft_batch(examples, tok)
    before = weights(worker)
    losses = [worker.train_sft(batch)["sft/loss"] for _ in range(6)]
    assert losses[-1] < 0.8 * losses[0], losses
    assert worker.weights_version == 6
    assert any(not torch.equal(before[k], v) for k, v in weights(worker).items())


def test_set_reference_copies_policy(worker, arithmetic_tokenizer):
    seq = generate(worker, arithmetic_tokenizer)
    policy0 = worker.compute_log_prob(seq)["old_log_probs"]
    ref0 = worker.compute_ref_log_prob(seq)["ref_log_prob"]
    assert torch.equal(policy0, ref0)  # at construction the reference is the policy
    worker.update_actor(training_batch(worker, seq))
    policy1 = worker.compute_log_prob(seq)["old_log_probs"]
    assert torch.equal(worker.compute_ref_log_prob(seq)["ref_log_prob"], ref0)  # frozen
    assert not torch.equal(policy1, ref0)
    worker.set_reference()
    assert torch.equal(worker.compute_ref_log_prob(seq)["ref_log_prob"], policy1)
    ref_state, pol_state = worker.local.ref.state_dict(), worker.local.policy.state_dict()
    for k, v in worker.export_weights().items():
        assert torch.equal(ref_state[k], pol_state[k]), k
    assert not any(p.requires_grad for p in worker.local.ref.parameters())
    # a copy, not an alias: training the policy again leaves the reference where it was
    worker.update_actor(training_batch(worker, seq, seed=1))
    assert torch.equal(worker.compute_ref_log_prob(seq)["ref_log_prob"], policy1)


def test_save_load_round_trip(worker, arithmetic_tokenizer, tmp_path):
    seq = generate(worker, arithmetic_tokenizer)
    worker.update_actor(training_batch(worker, seq))
    saved_lp = worker.compute_log_prob(seq)["old_log_probs"]
    saved_ref = worker.compute_ref_log_prob(seq)["ref_log_prob"]
    path = worker.save(str(tmp_path / "ckpt" / "actor"))
    assert path.endswith("actor") and (tmp_path / "ckpt" / "actor" / "tandem_complete").is_file()
    # move the policy away, then restore
    worker.update_actor(training_batch(worker, seq, seed=1))
    worker.set_reference()
    assert not torch.equal(worker.compute_log_prob(seq)["old_log_probs"], saved_lp)
    assert worker.load(path) == 1
    assert worker.weights_version == 1 and worker.update_calls == 1
    assert torch.equal(worker.compute_log_prob(seq)["old_log_probs"], saved_lp)
    assert torch.equal(worker.compute_ref_log_prob(seq)["ref_log_prob"], saved_ref)
    # the optimizer state came back too: the next update matches a fresh worker loaded the same way
    other = make_worker(arithmetic_tokenizer)
    other.load(path)
    batch = training_batch(worker, seq, seed=2)
    worker.update_actor(batch)
    other.update_actor(batch)
    assert torch.equal(worker.compute_log_prob(seq)["old_log_probs"], other.compute_log_prob(seq)["old_log_probs"])


def test_gspo_loss_mode_on_policy_and_trains(megatron_dist, arithmetic_tokenizer):
    """policy_loss.loss_mode=gspo: on-policy the sequence ratio is exactly 1 (no clipping,
    ppo_kl 0), and with one advantage A for every token the loss is exactly -A."""
    w = make_worker(arithmetic_tokenizer, "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                    "actor_rollout_ref.actor.clip_ratio_low=0.0003", "actor_rollout_ref.actor.clip_ratio_high=0.0004",
                    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")
    seq = generate(w, arithmetic_tokenizer)
    batch = seq.union(w.compute_log_prob(seq))
    batch.tensors["advantages"] = torch.full(seq["responses"].shape, 0.5)
    before = weights(w)
    metrics = w.update_actor(batch).metrics
    assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0
    # every token's loss is -A * s with s == 1 on-policy (metrics average micro-batches)
    assert abs(metrics["actor/pg_loss"] - (-0.5)) < 1e-6
    after = weights(w)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_unknown_policy_loss_mode_is_refused():
    from tandem.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.policy_loss.loss_mode"):
        load_config(None, ["actor_rollout_ref.actor.policy_loss.loss_mode=ppo2"])


def test_checkpoint_before_any_update_loads(worker, arithmetic_tokenizer, tmp_path):
    """A checkpoint taken before the first optimizer step has no optimizer state; loading it
    gives a fresh optimizer, so the next update equals a fresh worker's."""
    seq = generate(worker, arithmetic_tokenizer)
    path = worker.save(str(tmp_path / "step0" / "actor"))
    other = make_worker(arithmetic_tokenizer, "actor_rollout_ref.model.init_std=0.02")  # other weights
    other.load(path)
    batch = training_batch(worker, seq)
    worker.update_actor(batch)
    other.update_actor(batch)
    assert torch.equal(worker.compute_log_prob(seq)["old_log_probs"], other.compute_log_prob(seq)["old_log_probs"])


def test_free_cache_engine_releases_and_regenerates_the_same(worker, arithmetic_tokenizer):
    """actor_rollout_ref.rollout.free_cache_engine: the colocated engine drops its KV cache after
    each generation; the next generation allocates again and gives the same rows (same seed)."""
    from tandem.rollout.worker import RolloutWorker

    rows = [[arithmetic_tokenizer.bos_token_id] + arithmetic_tokenizer(t, add_special_tokens=False)["input_ids"]
            for t in TEXTS]
    ids, mask = left_pad(rows, arithmetic_tokenizer.pad_token_id)
    prompts = DataProto(tensors={"input_ids": ids, "attention_mask": mask})
    params = SamplingParams(max_new_tokens=6, temperature=0.9, n=N, seed=3)
    kept = RolloutWorker(worker.local.policy, pad_id=arithmetic_tokenizer.pad_token_id,
                         eos_id=arithmetic_tokenizer.eos_token_id, vocab_size=worker.vocab_size, max_batch_size=64)
    freed = RolloutWorker(worker.local.policy, pad_id=arithmetic_tokenizer.pad_token_id,
                          eos_id=arithmetic_tokenizer.eos_token_id, vocab_size=worker.vocab_size, max_batch_size=64,
                          free_cache_engine=True)
    first = freed.generate_sequences(prompts, params)
    assert freed.engine.runner is None  # cache and graphs released
    again = freed.generate_sequences(prompts, params)
    reference = kept.generate_sequences(prompts, params)
    assert kept.engine.runner is not None
    for key in ("responses", "response_mask", "rollout_log_probs"):
        assert torch.equal(first[key], again[key]) and torch.equal(first[key], reference[key]), key


def test_old_and_reference_log_probs_in_one_call(worker, arithmetic_tokenizer):
    """with_reference: the reference's pass right after the policy's, in the same call, the same numbers."""
    seq = generate(worker, arithmetic_tokenizer)
    both = worker.compute_log_prob(seq, calculate_entropy=True, with_reference=True)
    assert set(both.tensors) == {"old_log_probs", "entropys", "ref_log_prob"}
    assert torch.equal(both["old_log_probs"], worker.compute_log_prob(seq)["old_log_probs"])
    assert torch.equal(both["ref_log_prob"], worker.compute_ref_log_prob(seq)["ref_log_prob"])
