"""A step's metrics beside its phases' (controller/step.py): verl's data statistics of the batch
(critic/, response_length/, prompt_length/) and its perf/ figures.

Deliberately not here: the phases' own metrics (they come back from the services).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tandem.algos import metrics as M
from tandem.controller import scoring

if TYPE_CHECKING:  # annotations only
    from tandem.controller.step_context import Advantages, LogProbs, StepContext
    from tandem.data.batch import DataProto


def data_metrics(ctx: StepContext, gen: DataProto, lp: LogProbs, adv: Advantages) -> dict[str, float]:
    """verl's critic/, response_length/ and prompt_length/ statistics of the step's batch."""
    tensors = {"token_level_scores": adv.token_scores, "token_level_rewards": adv.rewards,
               "advantages": adv.advantages, "returns": adv.returns, "response_mask": adv.mask,
               # lengths as verl counts them: a multi-turn row's observations too (its attention mask)
               "response_length": scoring.response_tokens(gen).sum(-1),
               "prompt_mask": gen["attention_mask"][:, : gen["prompts"].shape[1]].float()}
    if ctx.use_critic:
        tensors["values"] = lp.values["values"]
    out = M.compute_data_metrics(tensors, use_critic=ctx.use_critic,
                                 max_response_length=ctx.cfg.data.max_response_length)
    return out | tool_metrics(gen)


def tool_metrics(gen: DataProto) -> dict[str, float]:
    """Tool calls, error observations, turns and observation tokens per row of a multi-turn generation,
    and its environment episodes' scores and errors (none of it for a single-turn one)."""
    if "tool_calls" not in gen.tensors:
        return {}
    observed = scoring.response_tokens(gen).bool() & ~gen["response_mask"].bool()
    turns = gen["num_turns"].float()
    out = {M.TOOL_CALLS_MEAN: float(gen["tool_calls"].float().mean()),
           M.TOOL_ERRORS_MEAN: float(gen["tool_errors"].float().mean()),
           M.TOOL_OBSERVATION_TOKENS_MEAN: float(observed.sum(-1).float().mean()),
           M.NUM_TURNS_MIN: float(turns.min()), M.NUM_TURNS_MAX: float(turns.max()), M.NUM_TURNS_MEAN: float(turns.mean())}
    played = [e for e in gen.columns.get("episode") or [] if e is not None]
    if played:
        out[M.EPISODE_SCORE_MEAN] = sum(sum(e["turn_scores"]) for e in played) / len(played)
        out[M.EPISODE_ERROR_RATIO] = sum(bool(e["error"]) for e in played) / len(played)
    return out


def perf_metrics(gen: DataProto, t_step: float, n_gpus: int = 1) -> dict[str, float]:
    """timing_s/step and perf/time_per_step (since `t_step`), tokens in the batch, and verl's
    throughput: tokens per second per device."""
    step_s = time.perf_counter() - t_step
    tokens = float(gen["attention_mask"].sum())
    return {M.TIMING_STEP: step_s, M.PERF_TIME_PER_STEP: step_s, M.PERF_TOTAL_NUM_TOKENS: tokens,
            M.PERF_THROUGHPUT: tokens / (step_s * n_gpus)}
