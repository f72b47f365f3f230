"""The vocabulary of logged metric names, and the per-step data metrics.

Every key Tandem logs is defined here once, with verl's name where verl has
one (``<role>/<quantity>``, ``timing_s/<phase>``), and a one-line definition in
``DEFINITIONS`` (the source for the metrics docs page). Code that logs a metric
uses the constant, never a string literal.

Deliberately not here: sinks, step counters, timers (``controller/tracking.py``).
"""

import math

import torch

from tandem.algos.aggregate import masked_sum

DEFINITIONS: dict[str, str] = {}


def _define(name: str, definition: str) -> str:
    if name in DEFINITIONS:
        raise ValueError(f"metric {name!r} defined twice")
    DEFINITIONS[name] = definition
    return name


# ---- actor update (averaged over micro-batches of one step) -------------------
ACTOR_PG_LOSS = _define("actor/pg_loss", "policy-gradient (clipped surrogate) loss, aggregated by loss_agg_mode")
ACTOR_PPO_KL = _define(
    "actor/ppo_kl", "mean over tokens of old_log_prob - log_prob: k1 KL(old policy || current policy)"
)
ACTOR_PG_CLIPFRAC = _define("actor/pg_clipfrac", "fraction of tokens where the PPO ratio clip is active")
ACTOR_PG_CLIPFRAC_LOWER = _define(
    "actor/pg_clipfrac_lower", "fraction of tokens with negative advantage where the dual clip (clip_ratio_c) is active"
)
ACTOR_ENTROPY = _define("actor/entropy", "mean over response tokens of the policy's next-token entropy (nats)")
ACTOR_KL_LOSS = _define("actor/kl_loss", "KL-to-reference loss term, before multiplying by its coefficient")
ACTOR_KL_COEF = _define("actor/kl_coef", "coefficient of the KL-to-reference loss term")
ACTOR_GRAD_NORM = _define("actor/grad_norm", "global L2 norm of actor gradients before clipping")
ACTOR_LR = _define("actor/lr", "actor learning rate at this step")
ACTOR_MOE_LOAD_BALANCING_LOSS = _define(
    "actor/moe_load_balancing_loss", "MoE router load-balancing loss (megatron-core's aux_loss; 1.0 = balanced) "
    "per MoE layer, token-weighted over micro-batches; trained with moe_aux_loss_coeff (MoE models only)"
)
SFT_MOE_LOAD_BALANCING_LOSS = _define(
    "sft/moe_load_balancing_loss", "the same during the supervised warm start (MoE models only)"
)
ACTOR_REWARD_KL_PENALTY = _define(
    "actor/reward_kl_penalty", "KL(rollout policy || reference) per token, averaged per row then over rows"
)
ACTOR_REWARD_KL_PENALTY_COEFF = _define(
    "actor/reward_kl_penalty_coeff", "beta of the in-reward KL penalty (the KL controller's value)"
)

# ---- critic update -------------------------------------------------------------
CRITIC_VF_LOSS = _define("critic/vf_loss", "clipped value loss 0.5 * max((v - R)^2, (clip(v) - R)^2), aggregated")
CRITIC_VF_CLIPFRAC = _define("critic/vf_clipfrac", "fraction of tokens where the clipped value error is the larger one")
CRITIC_VPRED_MEAN = _define("critic/vpred_mean", "mean over response tokens of current critic predictions")
CRITIC_GRAD_NORM = _define("critic/grad_norm", "global L2 norm of critic gradients before clipping")
CRITIC_LR = _define("critic/lr", "critic learning rate at this step")
CRITIC_MOE_LOAD_BALANCING_LOSS = _define(
    "critic/moe_load_balancing_loss", "the critic trunk's MoE router load-balancing loss (as actor/...)"
)

# ---- the critic process's memory (the actor's: perf/*, below; tandem/train/memory_metrics.py) -----
CRITIC_PERF_MAX_MEMORY_ALLOCATED_GB = _define(
    "perf/critic/max_memory_allocated_gb", "perf/max_memory_allocated_gb of the critic process")
CRITIC_PERF_MAX_MEMORY_RESERVED_GB = _define(
    "perf/critic/max_memory_reserved_gb", "perf/max_memory_reserved_gb of the critic process")
CRITIC_PERF_CPU_MEMORY_USED_GB = _define(
    "perf/critic/cpu_memory_used_gb", "perf/cpu_memory_used_gb of the critic process")

# ---- data of the step (compute_data_metrics) -----------------------------------
CRITIC_SCORE_MEAN = _define("critic/score/mean", "mean over rows of the sequence score (sum of token_level_scores)")
CRITIC_SCORE_MAX = _define("critic/score/max", "max over rows of the sequence score")
CRITIC_SCORE_MIN = _define("critic/score/min", "min over rows of the sequence score")
CRITIC_REWARDS_MEAN = _define("critic/rewards/mean", "mean over rows of the sequence reward (score minus KL penalty)")
CRITIC_REWARDS_MAX = _define("critic/rewards/max", "max over rows of the sequence reward")
CRITIC_REWARDS_MIN = _define("critic/rewards/min", "min over rows of the sequence reward")
CRITIC_ADVANTAGES_MEAN = _define("critic/advantages/mean", "mean over response tokens of advantages")
CRITIC_ADVANTAGES_MAX = _define("critic/advantages/max", "max over response tokens of advantages")
CRITIC_ADVANTAGES_MIN = _define("critic/advantages/min", "min over response tokens of advantages")
CRITIC_RETURNS_MEAN = _define("critic/returns/mean", "mean over response tokens of returns")
CRITIC_RETURNS_MAX = _define("critic/returns/max", "max over response tokens of returns")
CRITIC_RETURNS_MIN = _define("critic/returns/min", "min over response tokens of returns")
CRITIC_VALUES_MEAN = _define("critic/values/mean", "mean over response tokens of critic values at rollout time")
CRITIC_VALUES_MAX = _define("critic/values/max", "max over response tokens of critic values")
CRITIC_VALUES_MIN = _define("critic/values/min", "min over response tokens of critic values")
CRITIC_VF_EXPLAINED_VAR = _define(
    "critic/vf_explained_var", "1 - Var(returns - values) / (Var(returns) + 1e-5) over response tokens"
)
RESPONSE_LENGTH_MEAN = _define("response_length/mean", "mean number of response tokens per row")
RESPONSE_LENGTH_MAX = _define("response_length/max", "max number of response tokens in a row")
RESPONSE_LENGTH_MIN = _define("response_length/min", "min number of response tokens in a row")
RESPONSE_LENGTH_CLIP_RATIO = _define(
    "response_length/clip_ratio", "fraction of rows whose response reached max_response_length (truncated)"
)
PROMPT_LENGTH_MEAN = _define("prompt_length/mean", "mean number of prompt tokens per row")
PROMPT_LENGTH_MAX = _define("prompt_length/max", "max number of prompt tokens in a row")
PROMPT_LENGTH_MIN = _define("prompt_length/min", "min number of prompt tokens in a row")
PROMPT_LENGTH_CLIP_RATIO = _define(
    "prompt_length/clip_ratio", "fraction of rows whose prompt reached max_prompt_length"
)

# ---- wall-clock time of each phase of one step, in seconds --------------------
TIMING_GEN = _define("timing_s/gen", "seconds generating responses (rollout)")
TIMING_REWARD = _define("timing_s/reward", "seconds scoring responses")
TIMING_OLD_LOG_PROB = _define("timing_s/old_log_prob", "seconds recomputing log-probs under the current actor")
TIMING_REF = _define("timing_s/ref", "seconds computing reference-policy log-probs")
TIMING_VALUES = _define("timing_s/values", "seconds computing critic values")
TIMING_ADV = _define("timing_s/adv", "seconds computing KL penalty and advantages")
TIMING_UPDATE_CRITIC = _define("timing_s/update_critic", "seconds updating the critic")
TIMING_UPDATE_ACTOR = _define("timing_s/update_actor", "seconds updating the actor")
TIMING_UPDATE_WEIGHTS = _define("timing_s/update_weights", "seconds pushing actor weights to the rollout engine")
TIMING_TESTING = _define("timing_s/testing", "seconds running validation")
TIMING_SAVE_CHECKPOINT = _define("timing_s/save_checkpoint", "seconds saving a checkpoint")
TIMING_STEP = _define("timing_s/step", "seconds for the whole training step")
TIMING_WEIGHT_SYNC = _define(
    "timing_s/weight_sync", "seconds syncing the actor's new weights to every standalone rollout replica "
    "(the replicas pull them concurrently; controller/weight_sync.py)")

# ---- the weight plane (standalone rollout) ---------------------------------------
WEIGHT_SYNC_BYTES = _define("weight_sync/bytes", "bytes the rollout replicas pulled in the step's weight sync, summed")
WEIGHT_SYNC_GBPS = _define("perf/weight_sync_gbps", "weight_sync/bytes / timing_s/weight_sync, in GB/s (1e9 bytes)")
ROLLOUT_WEIGHTS_VERSION = _define(
    "rollout/weights_version", "the actor weights version the standalone rollout serves after the step's sync")

# ---- multi-turn rollouts (tandem/generation/multi_turn.py) ------------------------
TOOL_CALLS_MEAN = _define("rollout/tool_calls_mean", "mean number of tool calls per generated row (parsed calls)")
TOOL_ERRORS_MEAN = _define("rollout/tool_errors_mean", "mean number of error observations per row: failed or timed-out "
                           "calls, and turns that closed a call which did not parse")
NUM_TURNS_MIN = _define("num_turns/min", "fewest turns in a row (verl's: the prompt + model turns + observations)")
NUM_TURNS_MAX = _define("num_turns/max", "most turns in a row (verl's: the prompt + model turns + observations)")
NUM_TURNS_MEAN = _define("num_turns/mean", "mean turns per row (verl's: the prompt + model turns + observations)")
EPISODE_SCORE_MEAN = _define("rollout/episode_score_mean", "mean over the rows that played an environment episode of "
                             "the sum of its turn scores (turn_scores, each Step's reward)")
EPISODE_ERROR_RATIO = _define("rollout/episode_error_ratio", "share of the rows that played an environment episode "
                              "whose episode ended on an error (a failed or timed-out call)")
TOOL_OBSERVATION_TOKENS_MEAN = _define(
    "rollout/observation_tokens_mean", "mean number of tool-observation tokens per row (in the response, not in its loss)")

# ---- asynchronous training (controller/async_loop.py) -----------------------------
ASYNC_STALENESS_MEAN = _define(
    "async/staleness_mean", "mean over the step's trained rows of (actor version at the update - version that generated it)")
ASYNC_STALENESS_MAX = _define("async/staleness_max", "max over the step's trained rows of the same staleness")
ASYNC_BATCH = _define("async/batch", "the number of the batch the step trained on (its prompts' place in the data order)")
ASYNC_QUEUE_DEPTH = _define("async/queue_depth", "scored batches waiting in the queue when the step took its batch")
ASYNC_PRODUCER_IDLE = _define(
    "async/producer_idle_s", "seconds since the last step the producer waited (batches ahead, staleness bound, an update)")
ASYNC_CONSUMER_IDLE = _define("async/consumer_idle_s", "seconds since the last step the consumer waited for a batch")
ASYNC_DROPPED_BATCHES = _define("async/dropped_batches", "stale batches not trained on since the run began (cumulative)")

# ---- throughput and resources ---------------------------------------------------
PERF_TOTAL_NUM_TOKENS = _define("perf/total_num_tokens", "prompt + response tokens processed in the step")
PERF_TIME_PER_STEP = _define("perf/time_per_step", "seconds for the step (same as timing_s/step)")
PERF_THROUGHPUT = _define("perf/throughput", "tokens per second per GPU: total_num_tokens / (time_per_step * n_gpus)")
PERF_MAX_MEMORY_ALLOCATED_GB = _define(
    "perf/max_memory_allocated_gb", "the actor process's peak GPU memory held by tensors since its previous "
    "update (colocated: the step's generation, log-probs and update), GiB; 0 on CPU")
PERF_MAX_MEMORY_RESERVED_GB = _define(
    "perf/max_memory_reserved_gb", "the same for the memory PyTorch's caching allocator reserved, GiB; 0 on CPU")
PERF_CPU_MEMORY_USED_GB = _define(
    "perf/cpu_memory_used_gb", "the actor process's resident host memory after its update (pinned offload "
    "buffers included), GiB")
PERF_MFU_ACTOR = _define("perf/mfu/actor", "actor update model-FLOPs utilisation")

# ---- progress and validation ----------------------------------------------------
TRAINING_GLOBAL_STEP = _define("training/global_step", "number of completed training steps")
TRAINING_EPOCH = _define("training/epoch", "index of the current pass over the training data")
VAL_ACCURACY = _define("val/accuracy", "mean validation score (fraction correct for 0/1 rewards)")
TRAINING_ROLLOUT_PROBS_DIFF_MAX = _define(
    "training/rollout_probs_diff_max", "max over response tokens of |p_rollout - p_actor| (token probabilities)")
TRAINING_ROLLOUT_PROBS_DIFF_MEAN = _define("training/rollout_probs_diff_mean", "mean of the same")
TRAINING_ROLLOUT_PROBS_DIFF_STD = _define("training/rollout_probs_diff_std", "standard deviation of the same")

# ---- truncated importance sampling, DAPO, validation at N samples -----------------
ACTOR_TIS_IMP_RATIO_MEAN = _define(
    "actor/tis_imp_ratio_mean", "mean over response tokens of the truncated IS weight min(pi_old / pi_rollout, cap)")
ACTOR_TIS_CLIPFRAC = _define("actor/tis_clipfrac", "fraction of response tokens whose IS ratio exceeded the cap")
TRAIN_NUM_GEN_BATCHES = _define("train/num_gen_batches", "generation rounds run to fill the batch (DAPO dynamic sampling)")
TRAIN_NUM_DROPPED_GROUPS = _define(
    "train/num_dropped_groups", "prompt groups dropped because all their rewards were equal (DAPO dynamic sampling)")
TRAIN_NUM_KEPT_GROUPS = _define("train/num_kept_groups", "prompt groups kept for the update (DAPO dynamic sampling)")
CRITIC_OVERLONG_REWARD_MEAN = _define(
    "critic/overlong_reward/mean", "mean over rows of the DAPO overlong penalty added to the score (<= 0)")
CRITIC_OVERLONG_FRAC = _define("critic/overlong/frac", "fraction of rows longer than max_response_length - buffer len")
REWARD_FAILED_ROWS = _define("reward/failed_rows", "rows the reward could not score, dropped with their "
                             "prompt group (reward_model.on_failure=drop)")
VAL_FAILED_ROWS = _define("val/failed_rows", "validation rows the reward could not score, left out of the "
                          "validation metrics (reward_model.on_failure=drop)")
REWARD_BASELINE_MEAN = _define("critic/reward_baseline/mean", "mean score of the greedy baseline responses (ReMax)")
VAL_GREEDY_ACCURACY = VAL_ACCURACY  # greedy decoding, all validation prompts


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """Fraction of the variance of ``returns`` explained by ``values`` over masked-in tokens.

    ``1 - Var(returns - values) / (Var(returns) + 1e-5)`` with unbiased variances
    (as ``torch.var``) over tokens where ``mask`` is non-zero, computed in float64.
    1 is perfect, 0 is no better than a constant, negative is worse.

    Args:
        values: float ``[B, R]`` critic values.
        returns: float ``[B, R]`` targets.
        mask: bool/float ``[B, R]``; non-zero = include.

    Returns:
        Python float; NaN if fewer than two tokens are masked in.
    """
    keep = mask.bool()
    if int(keep.sum()) < 2:
        return math.nan
    ret = returns[keep].to(torch.float64)
    val = values[keep].to(torch.float64)
    return float(1.0 - torch.var(ret - val) / (torch.var(ret) + 1e-5))


def _mean_max_min(x: torch.Tensor) -> tuple[float, float, float]:
    if x.numel() == 0:
        return math.nan, math.nan, math.nan
    x = x.to(torch.float64)
    return float(x.mean()), float(x.max()), float(x.min())


def compute_data_metrics(
    batch_tensors: dict[str, torch.Tensor],
    use_critic: bool,
    max_response_length: int | None = None,
    max_prompt_length: int | None = None,
) -> dict[str, float]:
    """verl's per-step data metrics (scores, rewards, advantages, returns, values, lengths).

    Args:
        batch_tensors: named tensors of the step:
            ``token_level_scores``, ``token_level_rewards``, ``advantages``,
            ``returns``: float ``[B, R]``; ``response_mask``: bool/float ``[B, R]``;
            ``values``: float ``[B, R]`` (required when ``use_critic``);
            optionally ``prompt_mask`` (bool/float ``[B, P]``, 1 on real prompt
            tokens) or ``prompt_length`` (int/float ``[B]``), and ``response_length``
            (int/float ``[B]``: each row's real response tokens, a multi-turn row's
            observations included, as verl counts them from the attention mask;
            default: the ``response_mask``'s).
        use_critic: also report ``critic/values/*`` and ``critic/vf_explained_var``.
        max_response_length: length that counts as truncated for
            ``response_length/clip_ratio``; default R.
        max_prompt_length: same for prompts; default P with ``prompt_mask``.
            Without a prompt mask and without this, ``prompt_length/clip_ratio``
            is omitted.

    Returns:
        ``{metric name: float}``. Scores and rewards are per-row sums over real
        tokens; advantages, returns and values are over real tokens. Prompt
        metrics appear only if a prompt mask or lengths are given. A statistic of
        an empty selection is NaN.
    """
    response_mask = batch_tensors["response_mask"]
    keep = response_mask.bool()
    scores = masked_sum(batch_tensors["token_level_scores"], keep, dim=-1)  # [B]
    rewards = masked_sum(batch_tensors["token_level_rewards"], keep, dim=-1)  # [B]
    response_length = batch_tensors.get("response_length", keep.sum(dim=-1)).to(torch.float64)  # [B]
    if max_response_length is None:
        max_response_length = response_mask.shape[-1]

    metrics: dict[str, float] = {}

    def put(names: tuple[str, str, str], x: torch.Tensor) -> None:
        mean, max_, min_ = _mean_max_min(x)
        metrics.update({names[0]: mean, names[1]: max_, names[2]: min_})

    put((CRITIC_SCORE_MEAN, CRITIC_SCORE_MAX, CRITIC_SCORE_MIN), scores)
    put((CRITIC_REWARDS_MEAN, CRITIC_REWARDS_MAX, CRITIC_REWARDS_MIN), rewards)
    put((CRITIC_ADVANTAGES_MEAN, CRITIC_ADVANTAGES_MAX, CRITIC_ADVANTAGES_MIN), batch_tensors["advantages"][keep])
    put((CRITIC_RETURNS_MEAN, CRITIC_RETURNS_MAX, CRITIC_RETURNS_MIN), batch_tensors["returns"][keep])
    if use_critic:
        values = batch_tensors["values"]
        put((CRITIC_VALUES_MEAN, CRITIC_VALUES_MAX, CRITIC_VALUES_MIN), values[keep])
        metrics[CRITIC_VF_EXPLAINED_VAR] = explained_variance(values, batch_tensors["returns"], keep)

    put((RESPONSE_LENGTH_MEAN, RESPONSE_LENGTH_MAX, RESPONSE_LENGTH_MIN), response_length)
    metrics[RESPONSE_LENGTH_CLIP_RATIO] = float((response_length >= max_response_length).to(torch.float64).mean())

    prompt_length = None
    if "prompt_mask" in batch_tensors:
        prompt_mask = batch_tensors["prompt_mask"]
        prompt_length = prompt_mask.bool().sum(dim=-1).to(torch.float64)
        if max_prompt_length is None:
            max_prompt_length = prompt_mask.shape[-1]
    elif "prompt_length" in batch_tensors:
        prompt_length = batch_tensors["prompt_length"].to(torch.float64)
    if prompt_length is not None:
        put((PROMPT_LENGTH_MEAN, PROMPT_LENGTH_MAX, PROMPT_LENGTH_MIN), prompt_length)
        if max_prompt_length is not None:
            metrics[PROMPT_LENGTH_CLIP_RATIO] = float((prompt_length >= max_prompt_length).to(torch.float64).mean())
    return metrics


def rollout_probs_diff(rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor,
                       mask: torch.Tensor) -> dict[str, float]:
    """verl's engine-vs-trainer check: how far the rollout's token probabilities are from the
    actor's recomputation of the same tokens (a stale or mis-synced rollout shows here)."""
    diff = (rollout_log_probs.exp() - old_log_probs.exp()).abs()[mask.bool()]
    if diff.numel() == 0:
        return {}
    return {TRAINING_ROLLOUT_PROBS_DIFF_MAX: float(diff.max()), TRAINING_ROLLOUT_PROBS_DIFF_MEAN: float(diff.mean()),
            TRAINING_ROLLOUT_PROBS_DIFF_STD: float(diff.std()) if diff.numel() > 1 else 0.0}
