"""Gather TP shards of a megatron GPTModel and write a Hugging Face checkpoint.

Every TP rank must call `export_hf` (the gathers are collective, in table order); only TP
rank 0 (of data-parallel rank 0) writes out_dir: model.safetensors, config.json and, if
given, the files of a tokenizer directory. Tensors keep the model's dtype, so
HF -> megatron -> HF at the same dtype is bit-exact. Not handled: pp > 1, scalar heads.
MoE: expert weights are gathered over the expert-tensor-parallel group, then every expert-
parallel rank's experts over the EP group (rank r's table entry j is entry j of every other
rank's table, for experts r * E/ep + i), so all EP ranks must call it too.
"""
from __future__ import annotations

import json
import os
import shutil

import torch

from tandem.convert.reshard import expert_ranks, gather_shards
from tandem.models.mapping import Direct
from tandem.models.registry import hf_config_from_shape, weight_mappings


def _default_tp_group():
    from megatron.core import parallel_state

    if torch.distributed.is_initialized() and parallel_state.model_parallel_is_initialized():
        return parallel_state.get_tensor_model_parallel_group()
    return None


def _expert_groups(ep_size: int):
    """(expert-tensor-parallel group, expert-parallel group), None where there is no such split."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return None, None
    return (parallel_state.get_expert_tensor_parallel_group(),
            parallel_state.get_expert_model_parallel_group() if ep_size > 1 else None)


def _is_writer(tp_group) -> bool:
    from megatron.core import parallel_state

    if tp_group is not None and torch.distributed.get_rank(tp_group) != 0:
        return False
    if parallel_state.model_parallel_is_initialized():
        # context-parallel ranks hold the same weights too: one writer
        return parallel_state.get_data_parallel_rank(with_context_parallel=True) == 0
    return True


def export_hf(model, shape, out_dir: str, architecture: str, tp_group=None,
              tokenizer_dir: str | None = None) -> str | None:
    """Write `model` as an HF `architecture` checkpoint in out_dir; returns out_dir on the writer."""
    if tp_group is None:
        tp_group = _default_tp_group()
    params = dict(model.named_parameters())
    dtype = next(iter(params.values())).dtype
    config = hf_config_from_shape(shape, architecture, dtype=str(dtype).removeprefix("torch."))
    tensors: dict[str, torch.Tensor] = {}
    writer = _is_writer(tp_group)
    ep_rank, ep_size, _, _ = expert_ranks()
    etp_group, ep_group = _expert_groups(ep_size)
    tables = [weight_mappings(shape, r, ep_size, architecture) for r in range(ep_size)]
    for j, m in enumerate(tables[ep_rank]):
        local = params[m.megatron].detach()
        replicated = isinstance(m, Direct) and m.split_dim is None
        shards = [local] if replicated else gather_shards(local, etp_group if m.group == "etp" else tp_group)
        if m.group == "etp" and ep_size > 1:
            full = m.unshard(shards)
            for k, name in enumerate(m.hf_names):
                for r, t in enumerate(gather_shards(full[name], ep_group)):
                    tensors[tables[r][j].hf_names[k]] = t.cpu().contiguous()
        elif writer:
            tensors.update({k: v.cpu().contiguous() for k, v in m.unshard(shards).items()})
    if not writer:
        return None
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if tokenizer_dir is not None:
        for name in os.listdir(tokenizer_dir):
            src = os.path.join(tokenizer_dir, name)
            if os.path.isfile(src) and name != "config.json" and not name.endswith(".safetensors"):
                shutil.copy2(src, os.path.join(out_dir, name))
    return out_dir
