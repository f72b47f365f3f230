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
    (observation,) = _write_observations(runner, [int(runner.row[slot])], [index], [observation])
    runner.alive[slot] = False
    return index + 1 + len(observation)


def _write_observations(runner: ModelRunner, rows: list[int], indices: list[int],
                        observations: list[list[int]]) -> list[list[int]]:
    """Each observation, cut to the response budget, into its row's outputs after its response index
    (flagged as observation), in one copy to the device -> what was written of each."""
    r = runner.request.params.max_new_tokens
    cut = [obs[:max(0, r - 1 - index)] for obs, index in zip(observations, indices)]
    at = [(row, index + 1 + j) for row, index, obs in zip(rows, indices, cut) for j in range(len(obs))]
    if at:
        where = torch.tensor(at, dtype=torch.long).t().to(runner.device)
        runner.out_tok[where[0], where[1]] = torch.tensor([t for obs in cut for t in obs]).to(runner.device)
        runner.out_mask[where[0], where[1]] = True
        runner.out_obs[where[0], where[1]] = True
    return cut


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
    r = req.params.max_new_tokens
    slot_list, indices = [t[0] for t in turns], [t[1] for t in turns]
    rows = runner.row[torch.tensor(slot_list, device=dev)].tolist()  # the one host sync
    written = _write_observations(runner, rows, indices, [t[2] for t in turns])
    nexts = [index + 1 + len(obs) for index, obs in zip(indices, written)]
    going = [nxt < r for nxt in nexts]  # else no room is left for a model token: the row ends on its observation
    fed = [i for i in range(len(turns)) if going[i]]
    ended = [slot_list[i] for i in range(len(turns)) if not going[i]]
    if ended:
        runner.alive[torch.tensor(ended, device=dev)] = False
    if fed:
        width = max(1, max(len(written[i]) for i in fed))
        queue = torch.zeros((len(fed), width), dtype=torch.long)
        host = torch.tensor([[slot_list[i], rows[i], indices[i], len(written[i]),
                              runner.prompt_lens[rows[i] // req.params.n] + indices[i]] for i in fed])
        for k, i in enumerate(fed):
            queue[k, :len(written[i])] = torch.tensor(written[i], dtype=torch.long)
        queue, host = queue.to(dev), host.to(dev)
        slots, rows_t, index_t, lens, starts = host.unbind(1)
        runner.force_tok[slots, :width] = queue
        runner.force_at[slots] = 0
        runner.force_end[slots] = lens
        runner.tok[slots] = runner.out_tok[rows_t, index_t]  # the stop token, fed first at its own position
        runner.pos[slots] = starts
        runner.step[slots] = index_t + 1  # the next sample is the observation's first position: forced
        runner.alive[slots] = True
    return list(zip(nexts, going))
