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
def continue_rows(runner: ModelRunner, turns: list[tuple[int, int, list[int]]]) -> list[tuple[int, int | None, bool]]:
    """Rows stopped on a tool call, each (slot, response index of its last token - sampled, not yet
    fed -, observation): feed each row's last token and observation at its next cache positions, on
    top of its KV cache (the prefix is not recomputed), all rows in one forward, and sample each
    row's next model token. An observation is cut to the response budget. Returns, per row, (the
    next token's response index, that token (None: no room was left for it), whether it decodes on)."""
    req, dev = runner.request, runner.device
    r = req.params.max_new_tokens
    out: list[tuple[int, int | None, bool] | None] = [None] * len(turns)
    fed = []  # (position in turns, slot, row, index, tokens fed, next index)
    for i, (slot, index, observation) in enumerate(turns):
        row = int(runner.row[slot])
        observation, nxt = _write_observation(runner, row, index, observation)
        if nxt >= r:  # no room left for a model token: the row ends on its observation
            runner.alive[slot] = False
            out[i] = (nxt, None, False)
        else:
            fed.append((i, slot, row, index, [int(runner.out_tok[row, index])] + observation, nxt))
    if not fed:
        return out
    b, width = len(fed), max(len(f[4]) for f in fed)
    ids = torch.zeros((b, width), dtype=torch.long)
    for j, f in enumerate(fed):  # right padding: a row's real queries never see its pads (masked below)
        ids[j, :len(f[4])] = torch.tensor(f[4], dtype=torch.long)
    ids = ids.to(dev)
    slots = torch.tensor([f[1] for f in fed], device=dev)
    lens = torch.tensor([len(f[4]) for f in fed], device=dev)
    starts = torch.tensor([int(runner.prompt_lens[f[2] // req.params.n]) + f[3] for f in fed],
                          device=dev)  # cache position of each row's stop token
    runner.fed_tokens += int(lens.sum())
    positions = starts[:, None] + torch.arange(width, device=dev)[None]  # [B, W]
    rope_pos = (positions + runner.rope_off[slots][:, None]).clamp(max=runner.cache.max_len - 1)
    freqs = runner.freqs[rope_pos.t()].squeeze(2)  # [W, B, 1, rot_dim]
    span = int((starts + lens).max())
    allowed = (runner.key_pos[:span][None, None] <= positions[:, :, None])[:, None]  # [B, 1, W, span]
    real = torch.arange(width, device=dev)[None] < lens[:, None]  # [B, W]: not a pad
    b_idx, w_idx = real.nonzero(as_tuple=True)
    slot_idx, pos_idx = slots[b_idx], positions[b_idx, w_idx]

    def attend(layer_idx, q, k, v):  # [W, B, heads, d], [W, B, groups, d] x 2
        cache_k, cache_v = runner.cache.k[layer_idx], runner.cache.v[layer_idx]  # [slots, groups, S, d]
        cache_k[slot_idx, :, pos_idx] = k[w_idx, b_idx]
        cache_v[slot_idx, :, pos_idx] = v[w_idx, b_idx]
        keys, values = cache_k[slots, :, :span], cache_v[slots, :, :span]  # [B, groups, span, d]
        att = F.scaled_dot_product_attention(q.permute(1, 2, 0, 3), keys, values, attn_mask=allowed,
                                             scale=runner.scale, enable_gqa=runner.heads != runner.groups)
        return att.permute(2, 0, 1, 3).reshape(width, b, -1)

    h = runner._trunk(ids, freqs, attend)  # [W, B, H]
    last = h[lens - 1, torch.arange(b, device=dev)]  # [B, H]: each row's last real position
    rows_t = torch.tensor([f[2] for f in fed], device=dev)
    nxt_t = torch.tensor([f[5] for f in fed], device=dev)
    tok, logp = sample_rows(runner._logits(last[None]), req.params, runner.seed, rows_t + req.params.row_offset,
                            nxt_t)
    runner.out_tok[rows_t, nxt_t], runner.out_logp[rows_t, nxt_t] = tok, logp
    runner.out_mask[rows_t, nxt_t] = True
    going = ~(tok[:, None] == runner.stop_t[None]).any(-1) & (nxt_t + 1 < r)
    # as after a decode step: a stopped row's step stays on its stop token
    runner.tok[slots], runner.pos[slots], runner.step[slots] = tok, starts + lens, nxt_t + going.long()
    runner.alive[slots] = going
    for (i, *_, nxt), t, g in zip(fed, tok.tolist(), going.tolist()):
        out[i] = (nxt, t, g)
    return out
