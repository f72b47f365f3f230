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
anything else and the runner keeps the module path. On an H200 at batch 256 this took a
decode step from 5.4 to 3.3 ms (0.5B) and 7.9 to 5.4 ms (1.5B): bench/RESULTS.md.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tandem.generation.sampling import sample_tokens

log = logging.getLogger(__name__)

# inductor without its own CUDA graphs (the runner captures the whole step itself)
COMPILE_KW = dict(fullgraph=True, dynamic=False)


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
    n = x.shape[0]
    q, k, v = F.linear(x, w, b).view(n, groups, (qpg + 2) * d).split([qpg * d, d, d], dim=-1)
    q, k = _norm(q.reshape(n, groups, qpg, d), q_norm, eps), _norm(k, k_norm, eps)
    q = _rope(q, cos[:, None, None], sin[:, None, None])
    return q, _rope(k, cos[:, None], sin[:, None]), v


def proj_mlp(attn, h, proj_w, proj_b, norm2, fc1_w, fc1_b, fc2_w, fc2_b, next_norm, eps):
    """attention output [b, heads, ...] and residual h [b, H] -> (h after the layer, h
    normed by next_norm: the next layer's input norm or the final norm)."""
    h = h + F.linear(attn.reshape(h.shape[0], -1), proj_w, proj_b)
    gate, up = F.linear(_norm(h, norm2, eps), fc1_w, fc1_b).chunk(2, dim=-1)
    h = h + F.linear(F.silu(gate) * up, fc2_w, fc2_b)
    return h, _norm(h, next_norm, eps)


def head_sample(x, output, seed, rows, steps, greedy: bool, temperature: float, top_k: int, top_p: float):
    """final-normed x [b, H] -> (tokens [b], log-probs [b]) (sampling.sample_rows)."""
    return sample_tokens(F.linear(x, output), greedy, temperature, top_k, top_p, seed, rows, steps)


class DecodeFns:
    """The step's functions, compiled with torch.compile (GPU) or as written (CPU, tests).
    A function whose compilation fails falls back to the eager function, with a warning."""

    def __init__(self, compile: bool):
        if compile:  # one compiled graph per (function, batch size, sampling settings)
            cfg = torch._dynamo.config
            limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
            setattr(cfg, limit, max(getattr(cfg, limit), 64))
        for name, fn in (("embed_norm", embed_norm), ("qkv_rope", qkv_rope), ("proj_mlp", proj_mlp),
                         ("head_sample", head_sample)):
            setattr(self, name, _Guarded(fn, torch.compile(fn, **COMPILE_KW)) if compile else fn)


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
