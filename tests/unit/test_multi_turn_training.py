"""Training on multi-turn rows: tool observations are context for the model tokens after them, but
never carry loss, advantage or reward. Rows come from a real multi-turn generation (RolloutWorker)."""
import pytest
import test_generation_engine as base
import test_multi_turn_engine as turns
import torch

from tandem.algos import advantages as adv_algos
from tandem.config import ActorConfig
from tandem.controller import scoring
from tandem.controller.step_metrics import tool_metrics
from tandem.data.batch import DataProto
from tandem.generation.engine import left_pad
from tandem.generation.multi_turn import MultiTurn
from tandem.generation.sampling import SamplingParams
from tandem.models.forward import forward_logits
from tandem.rollout.worker import RolloutWorker
from tandem.train.losses import ppo_actor_loss

model, end_id = base.model, turns.end_id  # the tiny megatron model; a token it writes often


@pytest.fixture(scope="module")
def rows(model, end_id):
    worker = RolloutWorker(model, pad_id=base.PAD, eos_id=base.EOS, vocab_size=base.VOCAB, max_batch_size=64,
                           tools=MultiTurn(turns.Echo(), turns.Format(end_id), max_assistant_turns=3))
    ids, mask = left_pad(base.PROMPTS, base.PAD)
    return worker.generate_sequences(DataProto(tensors={"input_ids": ids, "attention_mask": mask}),
                                      SamplingParams(max_new_tokens=turns.R, temperature=1.0, seed=3, n=2))


def observations(gen):
    r = gen["responses"].shape[1]
    return gen["attention_mask"][:, -r:].bool() & ~gen["response_mask"].bool()


def test_the_rows_hold_observations_as_context_only(rows):
    obs = observations(rows)
    assert obs.sum() >= 6 and int(rows["tool_calls"].sum()) >= 2, "the test needs rows that called the tool"
    assert set(rows["responses"][obs].tolist()) <= set(turns.OK_TOKENS)
    assert (rows["rollout_log_probs"][obs] == 0).all()
    # verl's num_turns: the prompt, each call's answer, and a model turn before each and after the last
    # unless the answer filled the budget
    real = rows["attention_mask"][:, -obs.shape[1]:].bool()
    ends_on_obs = obs.gather(1, (real.sum(-1, keepdim=True) - 1)).squeeze(1)
    calls = rows["tool_calls"]
    assert torch.equal(rows["num_turns"], 1 + 2 * calls + (~ends_on_obs).long())
    assert int(rows["tool_errors"].sum()) == 0  # the echo tool always answers
    per_row = rows["num_turns"].float()
    assert tool_metrics(rows) == {"rollout/tool_calls_mean": float(calls.float().mean()),
                                  "rollout/tool_errors_mean": 0.0,
                                  "rollout/observation_tokens_mean": float(obs.sum(-1).float().mean()),
                                  "num_turns/min": float(per_row.min()), "num_turns/max": float(per_row.max()),
                                  "num_turns/mean": float(per_row.mean())}


def test_observations_get_no_gradient_no_advantage_no_reward(model, rows):
    """d loss / d logits is exactly 0 at every position that predicts an observation token, and
    not at the model's own tokens; the advantages and the outcome reward are 0 there."""
    obs, keep = observations(rows), rows["response_mask"].bool()
    n, r = len(rows), rows["responses"].shape[1]
    scores = torch.linspace(0, 1, n)
    token_scores = scoring.token_level(scores, rows["response_mask"].float())
    last = torch.where(keep, torch.arange(r), -1).max(-1).values
    assert torch.equal(token_scores[torch.arange(n), last], scores)  # on the last model token
    for estimator in ("grpo", "gae"):
        adv, _ = adv_algos.compute_advantage(
            estimator, token_level_rewards=token_scores, response_mask=rows["response_mask"].float(),
            values=torch.randn(n, r), index=torch.arange(n) // 2, gamma=1.0, lam=1.0)
        assert (adv[obs] == 0).all() and adv[keep].abs().sum() > 0, estimator

    mb = DataProto(tensors={"responses": rows["responses"], "response_mask": rows["response_mask"],
                            "old_log_probs": rows["rollout_log_probs"], "advantages": torch.randn(n, r)})
    model.zero_grad(set_to_none=True)
    logits = forward_logits(model, rows["input_ids"], rows["attention_mask"])
    logits.retain_grad()
    loss, _, _ = ppo_actor_loss(logits, mb, ActorConfig(), temperature=1.0)
    loss.backward()
    grad = logits.grad[:, -r - 1:-1].abs().sum(-1)  # [B, R]: the positions predicting response tokens
    assert (grad[obs] == 0).all()
    assert (grad[keep] > 0).all()
