"""The typed mappings between HF and megatron parameters, and `{layer}` expansion.

A family's table (tandem/models/families/) lists every parameter of a decoder with a
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
expert-tensor-parallel group; each expert lives on one expert-parallel rank, families/qwen3_moe.py).
Pipeline parallelism is out of scope here (layer numbers are global = local at pp=1).
Pure: torch only; reading checkpoints and gathering shards is tandem/convert's.
"""
from __future__ import annotations

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


def at_layer(m: Mapping, layer: int) -> Mapping:
    """A copy of `m` with `{layer}` replaced in every name field."""
    fields = {k: (v.replace(LAYER, str(layer)) if isinstance(v, str) else v) for k, v in m.__dict__.items()}
    return type(m)(**fields)


def expand(table: list[Mapping], num_layers: int) -> list[Mapping]:
    """Every concrete mapping of `table` for `num_layers` layers: a wildcard entry becomes one
    entry per layer, in place (table order, then layer order)."""
    out: list[Mapping] = []
    for m in table:
        if LAYER in m.megatron:
            out.extend(at_layer(m, i) for i in range(num_layers))
        else:
            out.append(m)
    return out
