"""ModelRunner: executes the scheduler's plans on a megatron-core GPTModel.

The model's own modules do the math (embedding, each layer's input_layernorm, linear_qkv via
`get_query_key_value_tensors`, megatron's RoPE, linear_proj, pre_mlp_layernorm, mlp, the final
layernorm and output_layer, with their TP communication); only attention and the KV cache are the
runner's: a preallocated `KVCache`, device-tensor positions and per-slot lengths, so one decode step
has static shapes and is captured in a CUDA graph (`graphs.py`) per (slots, kv_len, sampling).
Decode attention is `decode_attention.py`'s Triton kernel on GPUs (it also writes the step's K and V
into the cache, and reads each prompt group's prompt once: prefix_groups.py), else SDPA or two GEMMs.

Per-slot state lives in persistent device buffers: the last token, its cache position, the output
row, the response position, an alive flag and the tokens queued for the decode to feed (a tool's
observation: turn_prefill.py). A decode window of k steps records each step's token / log-prob /
row / position in window buffers; after the window they are scattered into the request's outputs by
row, and the alive flags are read back once (the only host sync of the window).

With `fused=True` (default on GPUs, TP = 1) decode runs the same math on the layers' weights through
`fused_step.py` instead of the modules: fewer, larger kernels, compiled by torch.compile when
`compile=True`, then captured in the same CUDA graphs. Prefill always runs the modules.

Not here: planning (scheduler.py), padding/result assembly (engine.py), pipeline parallelism, CUDA
graphs with TP > 1 (TP > 1 runs the same step eagerly).
"""
from __future__ import annotations

import importlib
import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tandem.generation.fused_step import DecodeFns, DecodeWeights, advance, rope_heads
from tandem.generation.graphs import DecodeGraphs
from tandem.generation.kv_cache import KVCache
from tandem.generation.prefix_groups import PrefixGroups
from tandem.generation.sampling import SamplingParams, sample_rows
from tandem.generation.scheduler import Plan

log = logging.getLogger(__name__)


def _triton_attention(device: torch.device, head_dim: int):
    """decode_attention.decode_attention where it runs (triton; CUDA or interpreted; its head sizes), else None."""
    try:
        kernel = importlib.import_module("tandem.generation.decode_attention")
    except ImportError as e:
        log.warning("triton decode attention unavailable (%s), using SDPA", e)
        return None
    if not kernel.supported(head_dim) or not (device.type == "cuda" or kernel.interpreting()):
        return None
    return kernel.decode_attention


@dataclass
class Request:
    """One generate() call as the runner sees it."""
    prompts: list[list[int]]
    params: SamplingParams
    stop_ids: list[int]
    seed: int


class ModelRunner:
    def __init__(self, model, *, device: torch.device, use_graphs: bool, window: int,
                 prefill_tokens: int = 32768, decode_attention: str = "sdpa",
                 fused: bool = False, compile: bool | str = False, shared_prefix: bool = True):
        from megatron.core import parallel_state

        if not (model.pre_process and model.post_process):
            raise ValueError("ModelRunner needs the whole model on one stage (pipeline size 1)")
        self.model = model
        self.device = device
        self.window = window
        self.prefill_tokens = prefill_tokens
        if decode_attention not in ("sdpa", "matmul", "triton"):
            raise ValueError(f"decode_attention must be 'sdpa', 'matmul' or 'triton', got {decode_attention!r}")
        self.layers = list(model.decoder.layers)
        att = self.layers[0].self_attention
        self.heads = att.num_attention_heads_per_partition
        self.groups = att.num_query_groups_per_partition
        self.head_dim = att.hidden_size_per_attention_head
        self.kernel = _triton_attention(device, self.head_dim) if decode_attention == "triton" else None
        self.shared_prefix = shared_prefix  # the kernel reads each prompt group's prompt once (prefix_groups.py)
        self.prefix: PrefixGroups | None = None
        self._prefix_by_n: dict[int, PrefixGroups] = {}
        self.decode_attention = "sdpa" if decode_attention == "triton" and self.kernel is None else decode_attention
        core = att.core_attention
        self.scale = getattr(core, "softmax_scale", None) or 1.0 / math.sqrt(self.head_dim)
        self.dtype = att.linear_qkv.weight.dtype
        groups = getattr(model, "pg_collection", None)  # the model's own (a TP=1 replica in a TP=2 service)
        tp = groups.tp.size() if groups is not None else parallel_state.get_tensor_model_parallel_world_size()
        self.graphs = DecodeGraphs() if use_graphs and tp == 1 else None
        self.fused = fused and tp == 1
        self.fns = DecodeFns(compile, device.type == "cuda") if self.fused else None
        self.weights: DecodeWeights | None = None
        self.cache: KVCache | None = None
        self._weights_sig = None

    # ---- buffers ---------------------------------------------------------------------

    def begin(self, request: Request, num_slots: int, max_len: int) -> None:
        """Size the cache and state buffers for a request and clear its outputs."""
        dev = self.device
        if self.cache is None or not self.cache.fits(num_slots, max_len, self.dtype):
            self.cache = None
            if self.graphs is not None:
                self.graphs.clear()
            self.cache = KVCache.allocate(len(self.layers), num_slots, self.groups, max_len,
                                          self.head_dim, self.dtype, dev)
            self._prefix_by_n.clear()
            s, w = num_slots, self.window
            # [max_len, 1, 1, rot_dim] fp32; packed_seq: every position (at context parallelism > 1
            # megatron would keep this rank's zig-zag share; generation runs whole sequences)
            self.freqs = self.model.rotary_pos_emb(max_len, packed_seq=True)
            # megatron's RoPE: cos/sin of the fp32 angles, cast to the model dtype
            self.cos = torch.cos(self.freqs).to(self.dtype).view(max_len, -1)
            self.sin = torch.sin(self.freqs).to(self.dtype).view(max_len, -1)
            self.key_pos = torch.arange(max_len, device=dev)
            self.tok = torch.zeros(s, dtype=torch.long, device=dev)
            self.pos = torch.zeros(s, dtype=torch.long, device=dev)
            self.rope_off = torch.zeros(s, dtype=torch.long, device=dev)
            self.row = torch.full((s,), -1, dtype=torch.long, device=dev)
            self.step = torch.zeros(s, dtype=torch.long, device=dev)
            self.alive = torch.zeros(s, dtype=torch.bool, device=dev)
            # tokens a slot's decode feeds instead of its samples: force_tok[slot, force_at:force_end]
            self.force_tok = torch.zeros((s, max_len), dtype=torch.long, device=dev)
            self.force_at, self.force_end = (torch.zeros(s, dtype=torch.long, device=dev) for _ in range(2))
            self.seed = torch.zeros((), dtype=torch.long, device=dev)
            self.win_j = torch.zeros(1, dtype=torch.long, device=dev)
            self.win_tok = torch.zeros((w, s), dtype=torch.long, device=dev)
            self.win_logp = torch.zeros((w, s), dtype=torch.float32, device=dev)
            self.win_row = torch.full((w, s), -1, dtype=torch.long, device=dev)
            self.win_step = torch.zeros((w, s), dtype=torch.long, device=dev)
            # per-request scalars the captured step reads from the device, not baked in
            self.max_pos = torch.tensor(max_len - 1, device=dev)
            self.max_new = torch.zeros((), dtype=torch.long, device=dev)
            self.row_offset = torch.zeros((), dtype=torch.long, device=dev)
            self._stops: dict[tuple, torch.Tensor] = {}
        sig = tuple(p.data_ptr() for p in self.model.parameters())
        if self.graphs is not None and sig != self._weights_sig:
            self.graphs.clear()  # a parameter was replaced: the graphs point at old memory
        self._weights_sig = sig
        if self.fused:  # references to the current parameters (None: not a model fused_step handles)
            self.weights = DecodeWeights.from_model(self.model)
        self.prefix = self._prefix_groups(request.params.n)
        for t in (self.alive, self.force_at, self.force_end):
            t.zero_()
        self.row.fill_(-1)
        self.seed.fill_(request.seed & 0xFFFFFFFF)
        self.max_new.fill_(request.params.max_new_tokens)
        self.row_offset.fill_(request.params.row_offset)
        self.request = request
        # RoPE position = cache position + the row's left padding in the returned batch, so
        # rollout positions are the actor's (RoPE is relative: the same math, but the same
        # numbers too, which keeps rollout and actor log-probs within fp32 noise).
        self.prompt_width = max(len(p) for p in request.prompts)
        self.prompt_lens = [len(p) for p in request.prompts]
        rows, r = len(request.prompts) * request.params.n, request.params.max_new_tokens
        # one extra row absorbs the writes of dead slots
        self.out_tok = torch.zeros((rows + 1, r), dtype=torch.long, device=dev)
        self.out_logp = torch.zeros((rows + 1, r), dtype=torch.float32, device=dev)
        self.out_mask = torch.zeros((rows + 1, r), dtype=torch.bool, device=dev)
        self.out_obs = torch.zeros((rows + 1, r), dtype=torch.bool, device=dev)  # tool observations
        self.fed_tokens = 0  # tokens run through the model outside decode (prefill, observations)
        key = tuple(request.stop_ids)
        if key not in self._stops:
            self._stops[key] = torch.tensor(request.stop_ids or [-1], dtype=torch.long, device=dev)
        self.stop_t = self._stops[key]

    def _prefix_groups(self, n: int) -> PrefixGroups | None:
        """The request's prompt groups for the kernel's prefix attention (None: each slot reads its own cache)."""
        if not (self.shared_prefix and self.kernel is not None):
            return None
        from tandem.generation.decode_attention import cascade_fits  # triton is there: the kernel is

        if not cascade_fits(n, self.heads // self.groups):
            return None
        if n not in self._prefix_by_n:  # one per n: captured graphs keep pointing at its tensors
            self._prefix_by_n[n] = PrefixGroups(self.cache.slots, n, self.device)
        groups = self._prefix_by_n[n]
        groups.reset()
        return groups

    def outputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens, log-probs, mask) [rows, R] on the device; the request's rows only."""
        return self.out_tok[:-1], self.out_logp[:-1], self.out_mask[:-1]

    def observation_mask(self) -> torch.Tensor:
        """[rows, R] bool: True on tool-observation tokens (not sampled by the model)."""
        return self.out_obs[:-1]

    # ---- execution ---------------------------------------------------------------------

    @torch.no_grad()
    def execute(self, plan: Plan) -> list[bool]:
        """Prefill the admitted prompts, run the plan's decode steps -> every slot's alive flag (one sync)."""
        admit = list(plan.admit)
        while admit:
            chunk, tokens = [], 0
            while admit and (not chunk or tokens + len(self.request.prompts[admit[0].prompt])
                             <= self.prefill_tokens):
                tokens += len(self.request.prompts[admit[0].prompt])
                chunk.append(admit.pop(0))
            self._prefill(chunk)
        if plan.decode_steps:
            self._decode_window(plan)
        return self.alive.tolist()

    def _prefill(self, admissions) -> None:
        req, dev = self.request, self.device
        prompts = [req.prompts[a.prompt] for a in admissions]
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # right padding: real tokens never see the pads (causal)
            ids[i, :len(p)] = torch.tensor(p, dtype=torch.long)
        n = req.params.n
        self.fed_tokens += sum(len(p) for p in prompts)
        slots = torch.tensor([s for a in admissions for s in a.slots], device=dev)
        rows = torch.tensor([a.prompt * n + j for a in admissions for j in range(n)], device=dev)
        of_slot = torch.arange(len(prompts), device=dev).repeat_interleave(n)  # prompt of each slot
        if self.prefix is not None:
            self.prefix.admit([(a.slots, len(p)) for a, p in zip(admissions, prompts)])
        off = self.prompt_width - lens  # [P]
        rope_pos = (off[:, None] + torch.arange(width, device=dev)[None]).clamp(max=self.cache.max_len - 1)
        freqs = self.freqs[rope_pos.t()].squeeze(2)  # [L, P, 1, rot_dim]

        def attend(layer_idx, q, k, v):  # [L, P, heads, d], [L, P, groups, d] x 2
            k, v = (t.permute(1, 2, 0, 3) for t in (k, v))  # [P, groups, L, d]
            self.cache.write_prefill(layer_idx, slots, k[of_slot], v[of_slot])
            out = F.scaled_dot_product_attention(
                q.permute(1, 2, 0, 3), k, v, is_causal=True, scale=self.scale,
                enable_gqa=self.heads != self.groups)  # [P, heads, L, d]
            return out.permute(2, 0, 1, 3).reshape(width, len(prompts), -1)

        h = self._trunk(ids.to(dev), freqs, attend)  # [L, P, H]
        last = h[lens - 1, torch.arange(len(prompts), device=dev)]  # [P, H]
        logits = self._logits(last[None])[of_slot]  # [P * n, V]
        tok, logp = sample_rows(logits, req.params, self.seed, rows + req.params.row_offset,
                                torch.zeros_like(rows))
        r = req.params.max_new_tokens
        zero = torch.zeros_like(rows)
        self.out_tok.index_put_((rows, zero), tok)
        self.out_logp.index_put_((rows, zero), logp)
        self.out_mask.index_put_((rows, zero), torch.ones_like(tok, dtype=torch.bool))
        alive = ~(tok[:, None] == self.stop_t[None]).any(-1) & (r > 1)
        self.tok.index_copy_(0, slots, tok)
        self.pos.index_copy_(0, slots, lens[of_slot])
        self.rope_off.index_copy_(0, slots, off[of_slot])
        self.row.index_copy_(0, slots, rows)
        self.step.index_copy_(0, slots, alive.long())  # a row stopped at once: its step indexes token 0
        self.alive.index_copy_(0, slots, alive)
        self.force_end.index_copy_(0, slots, self.force_at[slots])  # nothing queued for a new row

    def _decode_window(self, plan: Plan) -> None:
        b, kv_len, steps = plan.batch, plan.kv_len, plan.decode_steps
        self.win_j.zero_()
        self.win_row.fill_(-1)
        step_fn = lambda: self._decode_step(b, kv_len)  # noqa: E731
        if self.graphs is None:
            for _ in range(steps):
                step_fn()
        else:
            p = self.request.params
            key = (b, kv_len, p.greedy, p.temperature, p.top_k, p.top_p, p.max_new_tokens,
                   tuple(self.request.stop_ids), None if self.prefix is None else self.prefix.n)
            state = [self.tok, self.pos, self.step, self.alive, self.win_j, self.force_at]
            for _ in range(steps):
                self.graphs.replay(key, step_fn, state)
        # scatter the window into the outputs; dead entries go to the spare last row
        rows = self.win_row[:steps, :b].reshape(-1)
        rows = torch.where(rows < 0, self.out_tok.shape[0] - 1, rows)
        cols = self.win_step[:steps, :b].reshape(-1).clamp(max=self.out_tok.shape[1] - 1)
        self.out_tok.index_put_((rows, cols), self.win_tok[:steps, :b].reshape(-1))
        self.out_logp.index_put_((rows, cols), self.win_logp[:steps, :b].reshape(-1))
        self.out_mask.index_put_((rows, cols), torch.ones_like(rows, dtype=torch.bool))
        self.out_mask[-1] = False

    def _decode_step(self, b: int, kv_len: int) -> None:
        """One token for slots 0..b-1 against cache positions < kv_len (static shapes: capturable)."""
        tok, pos, row, step = (t[:b] for t in (self.tok, self.pos, self.row, self.step))
        allowed = None if self.kernel is not None else self._mask(pos, kv_len)
        p = self.request.params
        if self.weights is not None:
            cos, sin, draw_rows = self.fns.step_inputs(pos, self.rope_off[:b], row, self.cos, self.sin,
                                                       self.row_offset, self.max_pos)
            new_tok, logp = self._fused_step(tok, cos, sin, pos, allowed, kv_len, draw_rows, step)
        else:
            rope_pos = torch.minimum(pos + self.rope_off[:b], self.max_pos)
            freqs = self.freqs[rope_pos].transpose(0, 1)  # [1, b, 1, rot_dim]

            def attend(layer_idx, q, k, v):  # [1, b, heads, d], [1, b, groups, d] x 2
                qg = q[0].view(b, self.groups, self.heads // self.groups, self.head_dim)
                out = self._attend(layer_idx, qg, k[0], v[0], pos, allowed, kv_len)
                return out.reshape(1, b, self.heads * self.head_dim)

            h = self._trunk(tok[:, None], freqs, attend)  # [1, b, H]
            new_tok, logp = sample_rows(self._logits(h), p, self.seed, row.clamp(min=0) + self.row_offset, step)
        (self.fns.advance if self.fns is not None else advance)(
            new_tok, logp, self.tok, self.pos, self.alive, self.row, self.step, self.win_tok, self.win_logp,
            self.win_row, self.win_step, self.win_j, self.stop_t, self.max_new, self.max_pos, self.force_tok,
            self.force_at, self.force_end)

    def _mask(self, pos, kv_len) -> torch.Tensor:
        return (self.key_pos[:kv_len][None] <= pos[:, None])[:, None, None]  # [b, 1, 1, kv_len]

    def _run_kernel(self, layer_idx, q, k, v, pos, kv_len, **rope) -> torch.Tensor | None:
        """decode_attention.py's kernel (it writes k and v itself), or None once it has failed
        (it is then dropped for good and the runner uses SDPA)."""
        try:
            return self.kernel(q, k, v, self.cache.k[layer_idx], self.cache.v[layer_idx], pos, kv_len,
                               self.scale, prefix=None if self.prefix is None else self.prefix.tensors(), **rope)
        except Exception as e:  # noqa: BLE001 - a kernel that fails to build must not stop generation
            log.warning("triton decode attention failed, using SDPA: %s", e)
            self.kernel, self.decode_attention = None, "sdpa"
            return None

    def _attend_raw(self, layer_idx, qkv, bias, cos, sin, pos, allowed, kv_len) -> torch.Tensor:
        """_attend for the qkv GEMM's output [b, groups * (qpg + 2) * d] before bias and RoPE:
        the kernel applies both; without it, torch does (fused_step.rope_heads)."""
        b, g, d = qkv.shape[0], self.groups, self.head_dim
        qpg = self.heads // g
        heads = qkv.view(b, g, qpg + 2, d)
        if self.kernel is not None:
            out = self._run_kernel(layer_idx, heads[:, :, :qpg], heads[:, :, qpg], heads[:, :, qpg + 1], pos, kv_len,
                               bias=None if bias is None else bias.view(g, qpg + 2, d), cos=cos, sin=sin)
            if out is not None:
                return out
        q, k, v = rope_heads(qkv if bias is None else qkv + bias, None, None, cos, sin, None, g, qpg, d)
        return self._attend(layer_idx, q, k, v, pos, allowed, kv_len)

    def _attend(self, layer_idx, q, k, v, pos, allowed, kv_len) -> torch.Tensor:
        """Write k, v [b, groups, d] at each slot's position, attend q [b, groups, qpg, d]
        (a group's query heads are the query "sequence" of its KV head) over the first
        kv_len cache positions -> [b, groups, qpg, d]."""
        b = q.shape[0]
        if self.kernel is not None:
            out = self._run_kernel(layer_idx, q, k, v, pos, kv_len)
            if out is not None:
                return out
        if allowed is None:  # the kernel was dropped during this step
            allowed = self._mask(pos, kv_len)
        self.cache.write_decode(layer_idx, b, pos, k, v)
        keys = self.cache.k[layer_idx, :b, :, :kv_len]  # [b, groups, kv_len, d]
        values = self.cache.v[layer_idx, :b, :, :kv_len]
        if self.decode_attention == "sdpa":
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, scale=self.scale)
        # two batched GEMVs: [b, g, qpg, d] x [b, g, d, kv_len] -> ... -> [b, g, qpg, d]
        scores = torch.matmul(q, keys.transpose(-1, -2)).float() * self.scale
        scores = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        return torch.matmul(scores.to(values.dtype), values)

    def _fused_step(self, tok, cos, sin, pos, allowed, kv_len, rows, step):
        """The decode trunk, head and sampler through fused_step's functions -> (tokens, log-probs)."""
        w, f, p = self.weights, self.fns, self.request.params
        h, x = f.embed_norm(tok, w.embedding, w.layers[0].norm1, w.eps)
        qpg, d = self.heads // self.groups, self.head_dim
        for i, lw in enumerate(w.layers):
            if self.kernel is not None and lw.q_norm is None:  # bias and RoPE inside the attention kernel
                out = self._attend_raw(i, F.linear(x, lw.qkv_w), lw.qkv_b, cos, sin, pos, allowed, kv_len)
            else:
                q, k, v = f.qkv_rope(x, lw.qkv_w, lw.qkv_b, lw.q_norm, lw.k_norm, cos, sin, w.eps,
                                     self.groups, qpg, d)
                out = self._attend(i, q, k, v, pos, allowed, kv_len)
            nxt = w.layers[i + 1].norm1 if i + 1 < len(w.layers) else w.final_norm
            h, x = f.proj_mlp(out, h, lw.proj_w, lw.proj_b, lw.norm2, lw.fc1_w, lw.fc1_b, lw.fc2_w,
                              lw.fc2_b, nxt, w.eps)
        return f.head_sample(x, w.output, self.seed, rows, step, p.greedy, p.temperature, p.top_k, p.top_p)

    # ---- the model's modules -------------------------------------------------------------

    def _trunk(self, ids: torch.Tensor, freqs: torch.Tensor, attend) -> torch.Tensor:
        """ids [b, s] -> final hidden states [s, b, H], before the final layernorm."""
        from megatron.core.models.common.embeddings.rope_utils import (
            apply_rotary_pos_emb,
        )

        h = self.model.embedding(input_ids=ids, position_ids=None)  # [s, b, H]
        for i, layer in enumerate(self.layers):
            att = layer.self_attention
            cp = att.pg_collection.cp
            q, k, v = att.get_query_key_value_tensors(layer.input_layernorm(h), None)
            q = apply_rotary_pos_emb(q, freqs, config=att.config, cp_group=cp)
            k = apply_rotary_pos_emb(k, freqs, config=att.config, cp_group=cp)
            out, bias = att.linear_proj(attend(i, q, k, v))
            h = h + (out if bias is None else out + bias)
            out, bias = layer.mlp(layer.pre_mlp_layernorm(h))
            h = h + (out if bias is None else out + bias)
        return h

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """[s, b, H] -> full-vocab logits of the last position [b, V] (gathered over TP)."""
        m = self.model
        if m.decoder.final_layernorm is not None:
            h = m.decoder.final_layernorm(h)
        weight = m.shared_embedding_or_output_weight() if m.share_embeddings_and_output_weights else None
        logits, _ = m.output_layer(h[-1:], weight=weight, runtime_gather_output=True)
        return logits[0]
