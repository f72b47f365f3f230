"""From generated rows to rewards: decode, score on the reward service, shape, place on tokens.

`score` sends the decoded responses with their `ground_truth` and `data_source` to the
reward service ([B] floats, the verifier's score). `shaped_scores` adds DAPO's overlong
penalty when `reward_model.overlong_buffer.enable`; `token_level` puts a row's outcome
reward on its last response token, the place the advantage estimators and the KL
penalty expect it. `reward_metrics` logs what shaping and ReMax baselines did.

Deliberately not here: generating (controller/step.py), choosing rows (controller/dapo.py),
the verifiers themselves (services/reward/), advantages and KL (tandem/algos/).
"""
from __future__ import annotations

import asyncio
import copy

import torch

from tandem.algos import dapo as dapo_algos
from tandem.algos import metrics as M
from tandem.config import TandemConfig
from tandem.controller.reward_calls import RowScores, score_rows
from tandem.data.batch import DataProto


def response_tokens(gen: DataProto) -> torch.Tensor:
    """[B, R] 1 on every real response token: a multi-turn row's tool observations too, which are in
    attention_mask but not in response_mask (the loss mask)."""
    return gen["attention_mask"][:, -gen["responses"].shape[1]:]


def decode_responses(gen: DataProto, tokenizer) -> list[str]:
    """Each row's response tokens (padding left out, observations kept) as text, special tokens skipped."""
    rows = [r[m.bool()].tolist() for r, m in zip(gen["responses"], response_tokens(gen))]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


def reward_request(gen: DataProto, tokenizer, cfg: TandemConfig) -> DataProto:
    """The Score request: the decoded responses with the dataset's ground truth, data_source,
    extra_info and prompt text; for a reward model (reward_model.enable) also the token ids. Rows of
    an interaction rollout carry their episode in extra_info: `turn_scores` (each Step's reward, verl's
    key) and `episode` (name, done, error); the score is still the reward function's alone."""
    columns = {"response_text": decode_responses(gen, tokenizer), "ground_truth": gen["ground_truth"],
               "data_source": gen["data_source"]}
    for name in ("extra_info", "prompt_text"):
        if name in gen.columns:
            columns[name] = gen[name]
    if "turn_scores" in gen.columns:  # verl hands a reward function the turn scores in extra_info
        extra = columns.get("extra_info") or [{}] * len(gen)
        columns["extra_info"] = [{**(e or {}), "turn_scores": t, "episode": ep}
                                 for e, t, ep in zip(extra, gen["turn_scores"], gen["episode"])]
    tensors = {}
    if cfg.reward_model.enable:
        tensors = {"input_ids": gen["input_ids"], "attention_mask": gen["attention_mask"]}
    return DataProto(tensors=tensors, columns=columns)


async def score(reward, gen: DataProto, tokenizer, cfg: TandemConfig) -> RowScores:
    """The reward service's score of each generated row ([B] float32, NaN where it failed) and the
    failed rows, with the configured deadline and retries (controller/reward_calls.py).

    The responses are decoded in a worker thread (512 rows of 512 tokens: 0.1-0.2 s of CPU): on the
    event loop that work held back the step's other calls, the log-prob call started beside scoring
    first, while the GPU waited for it."""
    request = await asyncio.to_thread(reward_request, gen, thread_decoder(tokenizer), cfg)
    return await score_rows(reward, request, cfg)


def thread_decoder(tokenizer):
    """The tokenizer's copy that worker threads decode with: a fast tokenizer refuses a call from
    one thread while another holds it for an encode ("Already borrowed"); made once per tokenizer."""
    own = getattr(tokenizer, "_tandem_thread_decoder", None)
    if own is None:
        own = copy.deepcopy(tokenizer)
        tokenizer._tandem_thread_decoder = own
    return own


def shaped_scores(scores: torch.Tensor, response_mask: torch.Tensor, cfg: TandemConfig) -> torch.Tensor:
    """Scores plus DAPO's overlong penalty when reward_model.overlong_buffer is enabled (the length:
    every real response token, as verl counts it, observations included)."""
    ob = cfg.reward_model.overlong_buffer
    if not ob.enable:
        return scores
    return scores + dapo_algos.compute_overlong_penalty(
        response_mask.sum(-1), cfg.data.max_response_length, ob.len, ob.penalty_factor)


def token_level(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Outcome reward on each row's last response token: [B] -> [B, R]. The last token the model
    wrote: a multi-turn mask has holes where tool observations are."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    positions = torch.arange(response_mask.shape[-1]).expand(response_mask.shape)
    last = torch.where(response_mask.bool(), positions, -1).max(-1).values.clamp(min=0)
    out[torch.arange(len(scores)), last] = scores
    return out


def reward_metrics(gen: DataProto, cfg: TandemConfig) -> dict[str, float]:
    """Overlong shaping (mean penalty, share of rows penalised) and the ReMax baseline mean."""
    out = {}
    if cfg.reward_model.overlong_buffer.enable:
        penalty = gen["seq_reward"] - gen["acc"]
        out[M.CRITIC_OVERLONG_REWARD_MEAN] = float(penalty.mean())
        out[M.CRITIC_OVERLONG_FRAC] = float((penalty < 0).float().mean())
    if "reward_baselines" in gen.tensors:
        out[M.REWARD_BASELINE_MEAN] = float(gen["reward_baselines"].mean())
    return out
