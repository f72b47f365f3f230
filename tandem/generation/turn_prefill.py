"""Multi-turn on the runner's cache: where a stopped row stopped, and a tool observation fed into
the row's own KV cache slot on top of its prefix (the turn's continuation prefill), or written as
the last tokens of a row that ends there (an environment's final turn).

Runs between decode windows, eagerly, on the modules (the prefill's path): it writes the slot's
cache positions and its persistent decode state (last token, position, step, alive) in place, so
the captured decode graphs stay valid. Not here: which rows pause and when (multi_turn.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tandem.generation.runner import ModelRunner
from tandem.generation.sampling import sample_rows


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
    _, nxt = _write_observation(runner, int(runner.row[slot]), index, observation)
    runner.alive[slot] = False
    return nxt


def _write_observation(runner: ModelRunner, row: int, index: int, observation: list[int]) -> tuple[list[int], int]:
    """The observation, cut to the response budget, into the row's outputs after response index
    `index` (flagged as observation) -> (what was written, the index after it)."""
    observation = observation[:max(0, runner.request.params.max_new_tokens - 1 - index)]
    nxt = index + 1 + len(observation)
    if observation:
        cols = torch.arange(index + 1, nxt, device=runner.device)
        runner.out_tok[row, cols] = torch.tensor(observation, dtype=torch.long, device=runner.device)
        runner.out_mask[row, cols] = True
        runner.out_obs[row, cols] = True
    return observation, nxt


@torch.no_grad()
def continue_row(runner: ModelRunner, slot: int, index: int, observation: list[int]) -> tuple[int, int | None, bool]:
    """A row stopped on a tool call whose last token sits at response index `index` (sampled,
    not yet fed): feed it and the observation tokens at the row's next cache positions, on
    top of the row's KV cache (the prefix is not recomputed), and sample the model's next
    token. The observation is cut to the response budget. Returns (the next token's response
    index, that token (None: no room was left for it), whether the row decodes on)."""
    req, dev = runner.request, runner.device
    r = req.params.max_new_tokens
    row = int(runner.row[slot])
    observation, nxt = _write_observation(runner, row, index, observation)
    k = len(observation)
    if nxt >= r:  # no room left for a model token: the row ends on its observation
        runner.alive[slot] = False
        return nxt, None, False
    ids = torch.cat([runner.out_tok[row, index:index + 1],
                     torch.tensor(observation, dtype=torch.long, device=dev)])[None]  # [1, k + 1]
    start = runner.prompt_lens[row // req.params.n] + index  # cache position of the stop token
    width = k + 1
    runner.fed_tokens += width
    positions = torch.arange(start, start + width, device=dev)
    rope_pos = (positions + runner.rope_off[slot]).clamp(max=runner.cache.max_len - 1)
    freqs = runner.freqs[rope_pos[None].t()].squeeze(2)  # [width, 1, 1, rot_dim]
    allowed = runner.key_pos[:start + width][None] <= positions[:, None]  # [width, start + width]

    def attend(layer_idx, q, k_, v):  # [W, 1, heads, d], [W, 1, groups, d] x 2
        runner.cache.k[layer_idx, slot, :, start:start + width] = k_[:, 0].transpose(0, 1)
        runner.cache.v[layer_idx, slot, :, start:start + width] = v[:, 0].transpose(0, 1)
        keys = runner.cache.k[layer_idx, slot:slot + 1, :, :start + width]  # [1, groups, S, d]
        values = runner.cache.v[layer_idx, slot:slot + 1, :, :start + width]
        out = F.scaled_dot_product_attention(q.permute(1, 2, 0, 3), keys, values, attn_mask=allowed,
                                             scale=runner.scale, enable_gqa=runner.heads != runner.groups)
        return out.permute(2, 0, 1, 3).reshape(width, 1, -1)

    h = runner._trunk(ids, freqs, attend)  # [W, 1, H]
    rows_t = torch.tensor([row], device=dev)
    tok, logp = sample_rows(runner._logits(h), req.params, runner.seed, rows_t + req.params.row_offset,
                            torch.tensor([nxt], device=dev))
    runner.out_tok[row, nxt], runner.out_logp[row, nxt], runner.out_mask[row, nxt] = tok[0], logp[0], True
    going = not bool((tok[0] == runner.stop_t).any()) and nxt + 1 < r
    # as after a decode step: a stopped row's step stays on its stop token
    runner.tok[slot], runner.pos[slot], runner.step[slot] = tok[0], start + width, nxt + int(going)
    runner.alive[slot] = going
    return nxt, int(tok[0]), going
