"""Multi-turn on the runner's state: where a stopped row stopped, and a tool observation queued for
the row's own decode (feed_observations: the decode feeds it a token a step into the row's KV cache
slot, on top of its prefix), or written as the last tokens of a row that ends there (an environment's
final turn).

Runs between decode windows: it writes the slot's persistent decode state (last token, position,
step, alive, queued tokens) in place, so the captured decode graphs stay valid; no model runs here.
(Feeding an observation by its own eager forward, one per resume, made multi-turn generation 0.13x
single-turn's tokens/s on a GPU: bench/results/multi_turn_generation.md.) Not here: which rows pause
and when (multi_turn.py).
"""
from __future__ import annotations

import torch

from tandem.generation.runner import ModelRunner


def stopped_at(runner: ModelRunner, slots: list[int]) -> list[tuple[int, int, int]]:
    """(row, response index, token) of the token each of these stopped slots stopped on
    (one host sync). A dead slot's step no longer advances, so it indexes its stop token."""
    if not slots:
        return []
    idx = torch.tensor(slots, device=runner.device)
    rows, steps = runner.row[idx], runner.step[idx]
    toks = runner.out_tok[rows, steps.clamp(max=runner.out_tok.shape[1] - 1)]
    return list(zip(rows.tolist(), steps.tolist(), toks.tolist()))


def end_row(runner: ModelRunner, slot: int, index: int, observation: list[int]) -> int:
    """A row stopped at response index `index` whose episode is over: its last observation is written
    after the stop token (cut to the response budget) and the row ends there, with no model run (no
    token follows it). Returns the response index after the observation."""
    (observation,), _, _ = _write_observations(runner, [int(runner.row[slot])], [index], [observation])
    runner.alive[slot] = False
    return index + 1 + len(observation)


def _write_observations(runner: ModelRunner, rows: list[int], indices: list[int], observations: list[list[int]],
                        extra: list[list[int]] | None = None) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    """Each observation, cut to the response budget, into its row's outputs after its response index
    (flagged as observation), in two copies to the device and no sync -> (what was written of each; on
    the device, those tokens right-padded [B, W] and per row [row, index, length, *extra])."""
    r = runner.request.params.max_new_tokens
    cut = [obs[:max(0, r - 1 - index)] for obs, index in zip(observations, indices)]
    queue = torch.zeros((len(cut), max(1, *map(len, cut))), dtype=torch.long)
    for k, obs in enumerate(cut):
        queue[k, :len(obs)] = torch.tensor(obs, dtype=torch.long)
    meta = torch.tensor([[row, index, len(obs), *more] for row, index, obs, more
                         in zip(rows, indices, cut, extra or [[]] * len(cut))])
    queue, meta = queue.to(runner.device), meta.to(runner.device)
    j = torch.arange(queue.shape[1], device=runner.device)[None]
    real = j < meta[:, 2:3]
    # pads write 0 / False to the spare last row's first column (identical writes: deterministic)
    rows_t = torch.where(real, meta[:, :1], runner.out_tok.shape[0] - 1)
    cols = torch.where(real, meta[:, 1:2] + 1 + j, 0)
    runner.out_tok[rows_t, cols] = queue
    runner.out_mask[rows_t, cols] = real
    runner.out_obs[rows_t, cols] = real
    return cut, queue, meta


@torch.no_grad()
def feed_observations(runner: ModelRunner, turns: list[tuple[int, int, list[int]]]) -> list[tuple[int, bool]]:
    """Rows stopped on a tool call, each (slot, response index of its stop token - sampled, not yet fed -,
    observation): each observation, cut to the response budget, is written into its row's outputs and
    queued on its slot (runner.force_tok), and the slot is set to feed its stop token next. The decode
    then feeds the stop token and the observation a token a step, inside its CUDA graphs, writing their
    keys and values on top of the row's cached prefix (never recomputed), and samples the row's next
    model token after them as any other. One host sync and two copies for all the rows. Returns, per
    row, (the response index after its observation, whether it decodes on: False when the observation
    filled the budget and the row ends on it)."""
    if not turns:
        return []
    req, dev = runner.request, runner.device
    r, n = req.params.max_new_tokens, req.params.n
    slot_list, indices = [t[0] for t in turns], [t[1] for t in turns]
    rows = runner.row[torch.tensor(slot_list, device=dev)].tolist()  # the one host sync
    written, queue, meta = _write_observations(
        runner, rows, indices, [t[2] for t in turns],
        extra=[[slot, runner.prompt_lens[row // n] + index] for slot, row, index in zip(slot_list, rows, indices)])
    nexts = [index + 1 + len(obs) for index, obs in zip(indices, written)]
    going = [nxt < r for nxt in nexts]  # else no room is left for a model token: the row ends on its observation
    rows_t, index_t, lens, slots, starts = meta.unbind(1)
    # a row that decodes on queues its observation and feeds its stop token next, at its own position;
    # one that ends is only marked dead (its queue stays empty)
    on = index_t + 1 + lens < r  # `going`, on the device
    runner.force_tok[slots, :queue.shape[1]] = queue
    runner.force_at[slots] = 0
    runner.force_end[slots] = torch.where(on, lens, 0)
    runner.tok[slots] = runner.out_tok[rows_t, index_t]  # the stop token
    runner.pos[slots] = starts
    runner.step[slots] = index_t + 1  # the next sample is the observation's first position: forced
    runner.alive[slots] = on
    return list(zip(nexts, going))
