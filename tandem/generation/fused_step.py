"""The decode step on the layers' weights, in a few pure functions that torch.compile fuses.

The module path (`ModelRunner._trunk`) runs each megatron module as written: RMSNorm,
RoPE (cos/sin recomputed per layer), casts and SwiGLU pieces are ~40 small kernels per
layer, about half of a decode step on an H200. Here a layer is two functions of plain
tensors around the attention: `qkv_rope` (qkv GEMM, bias, RoPE on q and k) and
`proj_mlp` (output projection, residual, RMSNorm, SwiGLU MLP, residual and the next
layer's RMSNorm); `head_sample` is the LM head and the sampler. Each is compiled once per
batch size (the weights are arguments, so all layers share one compiled graph). The
attention and the KV-cache writes stay eager in the runner: a compiled function that
mutates the cache could copy all of it.

Same math and order as the modules (tested against them on CPU, uncompiled and
compiled). Only for the layer spec Tandem builds (RMSNorm, SwiGLU, RoPE, GQA, optional qkv
bias and q/k norms; no MoE) at TP = 1: `DecodeWeights.from_model` returns None for
anything else and the runner keeps the module path. Why: the module path launches ~1,000 small
kernels a decode step; compiled, each layer's norms, RoPE and SwiGLU are one kernel each
(bench/results/generation.md).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tandem.generation.sampling import sample_tokens
from tandem.models.compile import raise_recompile_limit, specialize_floats

log = logging.getLogger(__name__)

# inductor without its own CUDA graphs (the runner captures the whole step itself)
COMPILE_KW = dict(fullgraph=True, dynamic=False)
# compile modes: "plain" compiles the model math only; "step" also the step's index math
# and bookkeeping (~25 tiny kernels per step otherwise, each a launch in the graph);
# "autotune" (opt-in, CUDA only) also picks each layer GEMM among cuBLAS and inductor's
# Triton templates by timing them at the batch size: much longer compiles, and measured slower on
# an H200 (bench/results/generation.md): kept opt-in for other GPUs and shapes
MODES = ("plain", "step", "autotune")
DEFAULT_MODE = "step"
AUTOTUNE = dict(max_autotune_gemm=True, max_autotune_gemm_backends="ATEN,TRITON",
                benchmark_epilogue_fusion=False)  # fewer compiles


@dataclass
class LayerWeights:
    norm1: torch.Tensor
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor | None
    q_norm: torch.Tensor | None  # per-head RMSNorm of q and k before RoPE (Qwen3), or None
    k_norm: torch.Tensor | None
    proj_w: torch.Tensor
    proj_b: torch.Tensor | None
    norm2: torch.Tensor
    fc1_w: torch.Tensor
    fc1_b: torch.Tensor | None
    fc2_w: torch.Tensor
    fc2_b: torch.Tensor | None


@dataclass
class DecodeWeights:
    embedding: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor | None
    output: torch.Tensor  # [V, H]
    eps: float | None

    @classmethod
    def from_model(cls, model) -> "DecodeWeights | None":
        """References to a GPTModel's weights (detached views, no copies), or None when
        the model is not the plain RMSNorm / SwiGLU / RoPE decoder this step implements."""
        cfg = model.config
        if (cfg.normalization != "RMSNorm" or not cfg.gated_linear_unit or cfg.activation_func is not F.silu
                or getattr(cfg, "rotary_interleaved", False) or getattr(cfg, "num_moe_experts", None)
                or getattr(cfg, "multi_latent_attention", False) or getattr(cfg, "fp32_residual_connection", False)
                or getattr(cfg, "apply_residual_connection_post_layernorm", False)
                or getattr(model.embedding, "add_position_embedding", False)
                or getattr(model.output_layer, "bias", None) is not None):
            return None
        final = model.decoder.final_layernorm
        norms = [final] if final is not None else []
        layers = []
        for layer in model.decoder.layers:
            att, mlp = layer.self_attention, layer.mlp
            qk = [_module(getattr(att, "q_layernorm", None)), _module(getattr(att, "k_layernorm", None))]
            if not hasattr(mlp, "linear_fc1") or (qk[0] is None) != (qk[1] is None):
                return None
            norms += [layer.input_layernorm, layer.pre_mlp_layernorm] + [n for n in qk if n is not None]
            layers.append(LayerWeights(
                _w(layer.input_layernorm.weight), _w(att.linear_qkv.weight), _w(att.linear_qkv.bias),
                _w(qk[0].weight) if qk[0] is not None else None, _w(qk[1].weight) if qk[1] is not None else None,
                _w(att.linear_proj.weight), _w(att.linear_proj.bias), _w(layer.pre_mlp_layernorm.weight),
                _w(mlp.linear_fc1.weight), _w(mlp.linear_fc1.bias), _w(mlp.linear_fc2.weight),
                _w(mlp.linear_fc2.bias)))
        if not all(isinstance(n, torch.nn.RMSNorm) for n in norms) or len({n.eps for n in norms}) != 1:
            return None
        out = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights \
            else model.output_layer.weight
        return cls(_w(model.embedding.word_embeddings.weight), layers, _w(final.weight) if final is not None
                   else None, _w(out), norms[0].eps)


def _module(m):
    """None for an absent or identity submodule (the local spec's IdentityOp)."""
    from megatron.core.transformer.identity_op import IdentityOp

    return None if m is None or isinstance(m, IdentityOp) else m


def _w(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def _norm(h: torch.Tensor, weight: torch.Tensor | None, eps: float | None) -> torch.Tensor:
    return h if weight is None else F.rms_norm(h, (h.shape[-1],), weight, eps)


def _rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """megatron's non-interleaved RoPE (rotate_half) on the first cos.shape[-1] channels."""
    rot = cos.shape[-1]
    t, rest = t[..., :rot], t[..., rot:]
    x1, x2 = t.chunk(2, dim=-1)
    t = t * cos + torch.cat((-x2, x1), dim=-1) * sin
    return torch.cat((t, rest), dim=-1)


def embed_norm(tok, embedding, norm, eps):
    """tok [b] -> (residual h [b, H], first layer's normed input [b, H])."""
    h = F.embedding(tok, embedding)
    return h, _norm(h, norm, eps)


def qkv_rope(x, w, b, q_norm, k_norm, cos, sin, eps, groups: int, qpg: int, d: int):
    """x [b, H] normed, cos/sin [b, rot] -> q [b, groups, qpg, d], k and v [b, groups, d].
    megatron's fused qkv layout: per query group, its qpg query heads, then k, then v."""
    return rope_heads(F.linear(x, w, b), q_norm, k_norm, cos, sin, eps, groups, qpg, d)


def rope_heads(qkv, q_norm, k_norm, cos, sin, eps, groups: int, qpg: int, d: int):
    """qkv [b, groups * (qpg + 2) * d] (bias added) -> qkv_rope's q, k, v."""
    n = qkv.shape[0]
    q, k, v = qkv.view(n, groups, (qpg + 2) * d).split([qpg * d, d, d], dim=-1)
    q, k = _norm(q.reshape(n, groups, qpg, d), q_norm, eps), _norm(k, k_norm, eps)
    q = _rope(q, cos[:, None, None], sin[:, None, None])
    return q, _rope(k, cos[:, None], sin[:, None]), v


def _residual(h, y):
    """h + y, rounded as the modules' add. Written through fp32 so that inductor does not
    fold it into a cuBLAS addmm, which first copies h into the GEMM's output (a device
    copy per add, 2 per layer); this way the add runs inside the next norm's kernel."""
    return (h.float() + y.float()).to(h.dtype)


def proj_mlp(attn, h, proj_w, proj_b, norm2, fc1_w, fc1_b, fc2_w, fc2_b, next_norm, eps):
    """attention output [b, heads, ...] and residual h [b, H] -> (h after the layer, h
    normed by next_norm: the next layer's input norm or the final norm)."""
    h = _residual(h, F.linear(attn.reshape(h.shape[0], -1), proj_w, proj_b))
    gate, up = F.linear(_norm(h, norm2, eps), fc1_w, fc1_b).chunk(2, dim=-1)
    h = _residual(h, F.linear(F.silu(gate) * up, fc2_w, fc2_b))
    return h, _norm(h, next_norm, eps)


def step_inputs(pos, rope_off, row, cos, sin, row_offset, max_pos):
    """Slot positions -> (RoPE cos, sin [b, rot] at position + left padding, the rows the
    sampler draws for). row_offset and max_pos are device scalars (one graph for all)."""
    rope_pos = torch.minimum(pos + rope_off, max_pos)
    return cos[rope_pos], sin[rope_pos], row.clamp(min=0) + row_offset


def advance(new_tok, logp, tok, pos, alive, row, step, win_tok, win_logp, win_row, win_step, win_j,
            stop_t, max_new, max_pos, force_tok, force_at, force_end):
    """After a step of slots 0..b-1 (in place): record (token, log-prob, output row or -1
    for a dead slot, response position) at window index win_j, then advance the slots. A slot with
    tokens queued (force_tok[slot, force_at:force_end], a tool's observation) takes the next of them
    instead of its sample, with log-prob 0 and no stop check: the decode feeds observations."""
    b = new_tok.shape[0]
    a, r, s, p = alive[:b], row[:b], step[:b], pos[:b]
    at = force_at[:b]
    forced = at < force_end[:b]
    queued = force_tok[:b].gather(1, at.clamp(max=force_tok.shape[1] - 1)[:, None])[:, 0]
    new_tok = torch.where(forced, queued, new_tok)
    logp = logp.masked_fill(forced, 0.0)
    win_tok[:, :b].index_copy_(0, win_j, new_tok[None])
    win_logp[:, :b].index_copy_(0, win_j, logp[None])
    win_row[:, :b].index_copy_(0, win_j, torch.where(a, r, -1)[None])
    win_step[:, :b].index_copy_(0, win_j, s[None])
    at += (forced & a).long()
    stopped = (new_tok[:, None] == stop_t[None]).any(-1) & ~forced
    a.copy_(a & ~stopped & (s + 1 < max_new))
    s += a.long()  # the updated flags: the position of a row's next token
    tok[:b] = new_tok
    p.copy_(torch.minimum(p + 1, max_pos))
    win_j += 1


def head_sample(x, output, seed, rows, steps, greedy: bool, temperature: float, top_k: int, top_p: float):
    """final-normed x [b, H] -> (tokens [b], log-probs [b]) (sampling.sample_rows)."""
    return sample_tokens(F.linear(x, output), greedy, temperature, top_k, top_p, seed, rows, steps)


class DecodeFns:
    """The step's functions, compiled with torch.compile (GPU) or as written (CPU, tests).
    compile: False, True (DEFAULT_MODE) or a MODES name. A function whose compilation
    fails falls back to the eager function, with a warning."""

    def __init__(self, compile: bool | str, cuda: bool = True):
        mode = DEFAULT_MODE if compile is True else compile
        if mode and mode not in MODES:
            raise ValueError(f"compile must be a bool or one of {MODES}, got {compile!r}")
        if mode:  # one compiled graph per (function, batch size, sampling settings)
            raise_recompile_limit(64)
            specialize_floats()  # temperature / top-p: a graph per value, never a CPU tensor input (torch's
            # dynamic=False keeps a float constant only until a second value is seen)
        gemm = dict(options=AUTOTUNE) if mode == "autotune" and cuda else {}
        for name, fn, kw in (("embed_norm", embed_norm, {}), ("qkv_rope", qkv_rope, gemm),
                             ("proj_mlp", proj_mlp, gemm), ("head_sample", head_sample, {}),
                             ("step_inputs", step_inputs, None), ("advance", advance, None)):
            if not mode or (kw is None and mode == "plain"):
                setattr(self, name, fn)
            else:
                setattr(self, name, _Guarded(fn, torch.compile(fn, **COMPILE_KW, **(kw or {}))))


class _Guarded:
    def __init__(self, eager, compiled):
        self.eager, self.compiled = eager, compiled

    def __call__(self, *args):
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as e:  # noqa: BLE001 - a compiler bug must not stop generation
                log.warning("torch.compile of %s failed, running it eagerly: %s", self.eager.__name__, e)
                self.compiled = None
        return self.eager(*args)
