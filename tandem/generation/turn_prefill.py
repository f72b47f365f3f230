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
def continue_rows(runner: ModelRunner, turns: list[tuple[int, int, list[int]]]) -> list[tuple[int, int | None, bool]]:
    """Rows stopped on a tool call, each (slot, response index of its last token - sampled, not yet
    fed -, observation): feed each row's last token and observation at its next cache positions, on
    top of its KV cache (the prefix is not recomputed), all rows in one forward, and sample each
    row's next model token. An observation is cut to the response budget. Returns, per row, (the
    next token's response index, that token (None: no room was left for it), whether it decodes on)."""
    if not turns:
        return []
    req, dev = runner.request, runner.device
    r = req.params.max_new_tokens
    slot_list, indices = [t[0] for t in turns], [t[1] for t in turns]
    rows = runner.row[torch.tensor(slot_list, device=dev)].tolist()  # the one host sync
    written = _write_observations(runner, rows, indices, [t[2] for t in turns])
    nexts = [index + 1 + len(obs) for index, obs in zip(indices, written)]
    out: list[tuple[int, int | None, bool] | None] = [None] * len(turns)
    fed = [i for i, nxt in enumerate(nexts) if nxt < r]
    for i in set(range(len(turns))) - set(fed):  # no room left for a model token: the row ends on its observation
        runner.alive[slot_list[i]] = False
        out[i] = (nexts[i], None, False)
    if not fed:
        return out
    widths = [1 + len(written[i]) for i in fed]  # fed tokens of each row: its stop token and observation
    b, width = len(fed), max(widths)
    slots = torch.tensor([slot_list[i] for i in fed], device=dev)
    rows_t = torch.tensor([rows[i] for i in fed], device=dev)
    lens = torch.tensor(widths, device=dev)
    index_t = torch.tensor([indices[i] for i in fed], device=dev)
    nxt_t = torch.tensor([nexts[i] for i in fed], device=dev)
    # each row's stop token and observation, right padded (a row's real queries never see its pads)
    ids = torch.zeros((b, width), dtype=torch.long, device=dev)
    ids[:, 0] = runner.out_tok[rows_t, index_t]
    cols = torch.arange(width - 1, device=dev)[None]
    has_obs = cols < (lens - 1)[:, None]  # [B, W - 1]
    ids[:, 1:][has_obs] = runner.out_tok[rows_t[:, None], (index_t[:, None] + 1 + cols).clamp(max=r - 1)][has_obs]
    start_list = [runner.prompt_lens[rows[i] // req.params.n] + indices[i] for i in fed]  # of each stop token
    runner.fed_tokens += sum(widths)
    starts = torch.tensor(start_list, device=dev)
    positions = starts[:, None] + torch.arange(width, device=dev)[None]  # [B, W]
    rope_pos = (positions + runner.rope_off[slots][:, None]).clamp(max=runner.cache.max_len - 1)
    freqs = runner.freqs[rope_pos.t()].squeeze(2)  # [W, B, 1, rot_dim]
    span = max(st + w for st, w in zip(start_list, widths))
    allowed = (runner.key_pos[:span][None, None] <= positions[:, :, None])[:, None]  # [B, 1, W, span]
    # the real (not pad) queries, whose keys and values go into the cache
    b_idx, w_idx = (torch.tensor(x, device=dev) for x in zip(*[(k, j) for k, w in enumerate(widths) for j in range(w)]))
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
    tok, logp = sample_rows(runner._logits(last[None]), req.params, runner.seed, rows_t + req.params.row_offset,
                            nxt_t)
    runner.out_tok[rows_t, nxt_t], runner.out_logp[rows_t, nxt_t] = tok, logp
    runner.out_mask[rows_t, nxt_t] = True
    going = ~(tok[:, None] == runner.stop_t[None]).any(-1) & (nxt_t + 1 < r)
    # as after a decode step: a stopped row's step stays on its stop token
    runner.tok[slots], runner.pos[slots], runner.step[slots] = tok, starts + lens, nxt_t + going.long()
    runner.alive[slots] = going
    for i, (t, g) in zip(fed, torch.stack([tok, going.long()], 1).tolist()):
        out[i] = (nexts[i], t, bool(g))
    return out
