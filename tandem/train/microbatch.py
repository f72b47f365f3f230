"""Mini-batches (one optimizer step each) and micro-batches (one forward/backward each).

A micro-batch split is a row count, or a token budget (`MicroBatching`, verl's use_dynamic_bsz
with *_max_token_len_per_gpu): rows of real tokens vary several-fold in RL (responses end when
they end), so a row count that fits memory for the longest rows wastes most of each forward on
short ones, while a budget bounds memory by what it is made of and lets short rows share a
forward. Results do not depend on the split: gradients are summed over micro-batches and divided
by the mini-batch's loss units (tandem/train/schedule.py), and rows keep their order.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from tandem.data.batch import DataProto


@dataclass(frozen=True)
class MicroBatching:
    """Micro-batches of consecutive rows holding at most `max_tokens` real tokens each (a row's
    attention_mask), as few as that allows, balanced: the fewest such runs, then the smallest
    budget that still needs no more of them (so the last one is not a small remainder)."""
    max_tokens: int

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


Split = int | MicroBatching  # rows per micro-batch, or a token budget


def split_of(rows: int, use_dynamic_bsz: bool, max_token_len: int | None) -> Split:
    """A role's config keys -> its split (verl's: *_micro_batch_size_per_gpu, or with use_dynamic_bsz
    *_max_token_len_per_gpu)."""
    return MicroBatching(int(max_token_len)) if use_dynamic_bsz else rows


def actor_split(actor) -> Split:
    """actor_rollout_ref.actor's split: the update, SFT and the old log-prob pass."""
    return split_of(actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz, actor.ppo_max_token_len_per_gpu)


def ref_split(ref, actor) -> Split:
    """actor_rollout_ref.ref's split; its dynamic keys unset (None) follow the actor's, as in verl."""
    dynamic = actor.use_dynamic_bsz if ref.log_prob_use_dynamic_bsz is None else ref.log_prob_use_dynamic_bsz
    budget = ref.log_prob_max_token_len_per_gpu or actor.ppo_max_token_len_per_gpu
    return split_of(ref.log_prob_micro_batch_size_per_gpu, dynamic, budget)


def critic_split(critic, forward: bool = False) -> Split:
    """The critic's split for its update, or (forward) for its values pass."""
    budget = critic.forward_max_token_len_per_gpu if forward else critic.ppo_max_token_len_per_gpu
    return split_of(critic.ppo_micro_batch_size_per_gpu, critic.use_dynamic_bsz, budget)


def mini_batches(batch: DataProto, rows: int, epochs: int, shuffle: bool,
                 seed: int) -> list[DataProto]:
    """`epochs` passes over the batch in chunks of `rows` rows (a partial last chunk is kept)."""
    if rows < 1:
        raise ValueError(f"mini-batch size must be >= 1, got {rows}")
    out = []
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        b = batch.index(torch.randperm(len(batch), generator=gen)) if shuffle else batch
        out.extend(b.split(rows))
    return out


def micro_batches(batch: DataProto, split: Split) -> list[DataProto]:
    if isinstance(split, MicroBatching):
        sizes = token_runs(batch["attention_mask"].sum(1).tolist(), split.max_tokens)
        return [batch.slice(s, s + n) for s, n in zip(itertools.accumulate([0, *sizes]), sizes)]
    if split < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {split}")
    return batch.split(split)


def token_runs(lengths: list[int], max_tokens: int) -> list[int]:
    """Sizes of the runs of consecutive rows (of `lengths` tokens each) MicroBatching makes."""
    if not lengths:
        return []
    longest = max(lengths)
    if longest > max_tokens:
        raise ValueError(f"a row has {longest} tokens, more than the micro-batch token budget {max_tokens} "
                         "(*_max_token_len_per_gpu must be at least a row's prompt + response length)")
    count = len(_greedy(lengths, max_tokens))
    lo, hi = max(longest, -(-sum(lengths) // count)), max_tokens  # the smallest budget giving `count` runs
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_greedy(lengths, mid)) <= count:
            hi = mid
        else:
            lo = mid + 1
    return _greedy(lengths, lo)


def _greedy(lengths: list[int], cap: int) -> list[int]:
    """Rows in order, a new run whenever the next row would take the current one past `cap`."""
    sizes, load = [], cap + 1
    for n in lengths:
        if load + n > cap:
            sizes.append(0)
            load = 0
        sizes[-1] += 1
        load += n
    return sizes
