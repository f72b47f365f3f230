"""Atomic checkpoint files: write to a temporary name, fsync, then rename.

A crash mid-save leaves the previous checkpoint intact. (Sharded megatron-core
dist_checkpointing with resharding on load belongs to the Megatron-sharded roles issue.)
"""
from __future__ import annotations

import os

import torch


def save_atomic(state: dict, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load(path: str) -> dict:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist")
    return torch.load(path, map_location="cpu", weights_only=True)


def model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by name, without megatron's `_extra_state` entries."""
    return {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
