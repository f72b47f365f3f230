"""HF <-> megatron parameter names and the typed mappings that reshape/slice them.

One table (`llama_family_mappings`) lists every parameter of a Llama/Qwen2 decoder with a
`{layer}` wildcard. Each entry is one of:

- `Direct`: one HF tensor <-> one megatron tensor, split along `split_dim` over TP
  (None = replicated, e.g. norms);
- `QKV`: HF q_proj/k_proj/v_proj (weights or biases) <-> megatron linear_qkv, whose rows are
  interleaved per query group g: [q heads of g (heads/groups of them), k_g, v_g]; TP slices
  whole groups, so rank r holds groups [r*G/tp, (r+1)*G/tp);
- `GatedMLP`: HF gate_proj, up_proj <-> megatron linear_fc1 = [gate; up]; each TP rank holds
  [gate_shard; up_shard] (column-parallel on both halves).

`shard(hf, tp_rank, tp_size)` builds this rank's megatron tensor from full HF tensors;
`unshard(shards)` takes every rank's megatron shard (rank order) and returns full HF tensors.
`group` names the ranks a tensor is split over: "tp", or "etp" for routed experts (megatron's
expert-tensor-parallel group; each expert lives on one expert-parallel rank, moe_mapping.py).
Pipeline parallelism is out of scope here (layer numbers are global = local at pp=1).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

LAYER = "{layer}"


def _split(t: torch.Tensor, dim: int, tp_rank: int, tp_size: int) -> torch.Tensor:
    if t.shape[dim] % tp_size:
        raise ValueError(f"dim {dim} of size {t.shape[dim]} is not divisible by tp={tp_size}")
    return t.chunk(tp_size, dim=dim)[tp_rank]


@dataclass(frozen=True)
class Direct:
    megatron: str
    hf: str
    split_dim: int | None = None  # None: replicated on every TP rank
    group: str = "tp"

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.hf,)

    def shard(self, hf: dict[str, torch.Tensor], tp_rank: int, tp_size: int) -> torch.Tensor:
        t = hf[self.hf]
        if self.split_dim is None or tp_size == 1:
            return t
        return _split(t, self.split_dim, tp_rank, tp_size)

    def unshard(self, shards: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.split_dim is None or len(shards) == 1:
            return {self.hf: shards[0]}
        return {self.hf: torch.cat(shards, dim=self.split_dim)}


@dataclass(frozen=True)
class QKV:
    """HF q/k/v (weight [n*d, h] or bias [n*d]) <-> megatron linear_qkv, interleaved per group."""
    megatron: str
    q: str
    k: str
    v: str
    num_heads: int
    num_groups: int
    head_dim: int
    group: str = "tp"

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.q, self.k, self.v)

    def shard(self, hf: dict[str, torch.Tensor], tp_rank: int, tp_size: int) -> torch.Tensor:
        g, d = self.num_groups, self.head_dim
        q, k, v = hf[self.q], hf[self.k], hf[self.v]
        rest = q.shape[1:]  # (h,) for weights, () for biases
        # [G, (heads/G)*d + d + d, ...]: per group, its q heads then its k and v head.
        fused = torch.cat([q.reshape(g, -1, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)], dim=1)
        if g % tp_size:
            raise ValueError(f"num_query_groups={g} is not divisible by tp={tp_size}")
        fused = fused.chunk(tp_size, dim=0)[tp_rank]
        return fused.reshape(-1, *rest)

    def unshard(self, shards: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        g, d = self.num_groups, self.head_dim
        full = torch.cat(shards, dim=0)  # groups are contiguous per rank: concat = full layout
        rest = full.shape[1:]
        qd = (self.num_heads // g) * d
        q, k, v = full.reshape(g, qd + 2 * d, *rest).split([qd, d, d], dim=1)
        return {self.q: q.reshape(-1, *rest).contiguous(),
                self.k: k.reshape(-1, *rest).contiguous(),
                self.v: v.reshape(-1, *rest).contiguous()}


@dataclass(frozen=True)
class GatedMLP:
    """HF gate_proj, up_proj [ffn, h] <-> megatron linear_fc1 [2*ffn/tp, h] = [gate_r; up_r]."""
    megatron: str
    gate: str
    up: str
    group: str = "tp"

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.gate, self.up)

    def shard(self, hf: dict[str, torch.Tensor], tp_rank: int, tp_size: int) -> torch.Tensor:
        return torch.cat([_split(hf[self.gate], 0, tp_rank, tp_size),
                          _split(hf[self.up], 0, tp_rank, tp_size)], dim=0)

    def unshard(self, shards: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        halves = [s.chunk(2, dim=0) for s in shards]
        return {self.gate: torch.cat([h[0] for h in halves], dim=0),
                self.up: torch.cat([h[1] for h in halves], dim=0)}


Mapping = Direct | QKV | GatedMLP

# HF keys found in some checkpoints that carry no weights (recomputed buffers): skipped on load.
IGNORED_HF = (re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"),)


def llama_family_mappings(shape) -> list[Mapping]:
    """The table for Llama / Qwen2 (megatron local spec names), with `{layer}` wildcards."""
    d = shape.kv_channels
    attn = dict(num_heads=shape.num_attention_heads, num_groups=shape.num_key_value_heads, head_dim=d)
    hl, ml = "model.layers.{layer}.", "decoder.layers.{layer}."
    table: list[Mapping] = [
        Direct("embedding.word_embeddings.weight", "model.embed_tokens.weight", 0),
        Direct(ml + "input_layernorm.weight", hl + "input_layernorm.weight"),
        QKV(ml + "self_attention.linear_qkv.weight", hl + "self_attn.q_proj.weight",
            hl + "self_attn.k_proj.weight", hl + "self_attn.v_proj.weight", **attn),
        Direct(ml + "self_attention.linear_proj.weight", hl + "self_attn.o_proj.weight", 1),
        Direct(ml + "pre_mlp_layernorm.weight", hl + "post_attention_layernorm.weight"),
        GatedMLP(ml + "mlp.linear_fc1.weight", hl + "mlp.gate_proj.weight", hl + "mlp.up_proj.weight"),
        Direct(ml + "mlp.linear_fc2.weight", hl + "mlp.down_proj.weight", 1),
        Direct("decoder.final_layernorm.weight", "model.norm.weight"),
    ]
    if shape.attention_bias:
        table.append(QKV(ml + "self_attention.linear_qkv.bias", hl + "self_attn.q_proj.bias",
                         hl + "self_attn.k_proj.bias", hl + "self_attn.v_proj.bias", **attn))
    if not shape.tie_word_embeddings:
        table.append(Direct("output_layer.weight", "lm_head.weight", 0))
    return table


def _expand(m: Mapping, layer: int) -> Mapping:
    """A copy of `m` with `{layer}` replaced in every name field."""
    fields = {k: (v.replace(LAYER, str(layer)) if isinstance(v, str) else v) for k, v in m.__dict__.items()}
    return type(m)(**fields)


def expand_mappings(shape, ep_rank: int = 0, ep_size: int = 1) -> list[Mapping]:
    """Every concrete mapping for `shape.num_hidden_layers` layers (table order, layer-major);
    for a MoE shape only the experts that expert-parallel rank `ep_rank` holds."""
    if shape.moe is not None:
        from tandem.convert.moe_mapping import moe_mappings

        return moe_mappings(shape, ep_rank, ep_size)
    out: list[Mapping] = []
    for m in llama_family_mappings(shape):
        if LAYER in m.megatron:
            out.extend(_expand(m, i) for i in range(shape.num_hidden_layers))
        else:
            out.append(m)
    return out
