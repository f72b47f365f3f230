"""DAPO dynamic sampling (verl's `algorithm.filter_groups`): generate prompt batches,
drop the groups whose rewards are all equal (they carry no group-relative signal), and
keep generating until `data.train_batch_size` groups are kept, at most
`algorithm.filter_groups.max_num_gen_batches` rounds.

The filter itself is pure (`tandem.algos.dapo.varied_group_mask`); this module is the
loop around the rollout and reward calls. Difference from verl: when the bound is hit
verl raises; here the step trains on the groups kept so far (logged, and an error only
if none was kept), so a long run does not die on one unlucky step.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable

import torch

from tandem.algos import metrics as M
from tandem.algos.dapo import varied_group_mask
from tandem.config import TandemConfig
from tandem.data.batch import DataProto
from tandem.logging import get_logger
from tandem.rollout.outputs import concat_generations

_log = get_logger("controller.dapo")

# filter_groups.metric -> the per-row tensor generate_and_score() adds
METRIC_COLUMNS = {"acc": "acc", "score": "acc", "seq_reward": "seq_reward"}


async def collect_varied_groups(
    generate: Callable[[DataProto, int], Awaitable[DataProto]],
    prompts: DataProto | Callable[[int], DataProto],
    cfg: TandemConfig,
    pad_id: int,
) -> tuple[DataProto, dict[str, float]]:
    """-> (generations of exactly train_batch_size kept groups, or fewer if the bound was
    hit; metrics train/num_gen_batches, train/num_dropped_groups, train/num_kept_groups).

    `generate(prompts, round)` returns scored rows, n per prompt, prompt-major.
    `prompts` is a function k -> the next k prompts (a fixed batch allows one round only).
    """
    fg, n = cfg.algorithm.filter_groups, cfg.actor_rollout_ref.rollout.n
    want = cfg.data.train_batch_size
    gen_batch = cfg.data.gen_batch_size or want
    column = METRIC_COLUMNS[fg.metric]
    kept: list[DataProto] = []
    kept_groups = dropped = rounds = failed = 0
    while kept_groups < want and (fg.max_num_gen_batches <= 0 or rounds < fg.max_num_gen_batches):
        if callable(prompts):
            batch = prompts(gen_batch)
        elif rounds == 0:
            batch = prompts
        else:
            break
        gen = await generate(batch, rounds)
        rounds += 1
        failed += int(gen.meta.get("reward_failed_rows", 0))
        if len(gen) == 0:
            continue
        groups = torch.arange(len(gen)) // n
        keep_group = varied_group_mask(gen[column], groups).view(-1, n)[:, 0]  # [G]
        dropped += int((~keep_group).sum())
        rows = torch.nonzero(keep_group.repeat_interleave(n)).flatten()
        if len(rows):
            kept.append(gen.index(rows))
            kept_groups += len(rows) // n
    if not kept:
        raise RuntimeError(f"algorithm.filter_groups: all {dropped} groups of {rounds} generation batches "
                           f"had equal {fg.metric}; raise max_num_gen_batches or check the data and reward")
    if kept_groups < want:
        _log.warning("dapo.batch_not_full", kept_groups=kept_groups, wanted=want, gen_batches=rounds,
                     dropped_groups=dropped)
    out = concat_generations(kept, pad_id)
    out = out.slice(0, min(kept_groups, want) * n)
    return out, {M.TRAIN_NUM_GEN_BATCHES: float(rounds), M.TRAIN_NUM_DROPPED_GROUPS: float(dropped),
                 M.TRAIN_NUM_KEPT_GROUPS: float(min(kept_groups, want)), M.REWARD_FAILED_ROWS: float(failed)}
