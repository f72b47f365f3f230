"""Checkpoints: megatron-core dist_checkpointing directories, written atomically.

Every rank writes its shards into `<path>.tmp`; once all have, rank 0 swaps the finished
directory into place, so a crash mid-save leaves the previous checkpoint intact. Loading
reshards: a checkpoint saved at one TP / DP layout loads at another.
"""
from __future__ import annotations

import os
import shutil

import torch
import torch.distributed as dist

DONE = "tandem_complete"  # written last: a directory without it is not a checkpoint


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _write_without_fork() -> None:
    """megatron-core 0.16 writes each file from a forked process, which can hang in a
    process with gRPC threads (a fork copies their held locks); 0.19 writes from threads.
    On 0.16, write the same buckets with the same function in this thread."""
    import queue

    from megatron.core.dist_checkpointing.strategies.filesystem_async import (
        FileSystemWriterAsync as W,
    )

    if hasattr(W, "write_preloaded_data_multithread") or getattr(W, "_tandem_no_fork", False):
        return

    def write_in_thread(transform_list, use_msc, rank, write_buckets, global_results_queue):
        results, count = queue.Queue(), queue.Queue()
        for i, bucket in enumerate(write_buckets):
            count.put(i)
            W.write_preloaded_data(transform_list, i, bucket, results, count, True, use_msc=use_msc)
        out: dict | Exception = {}
        while not results.empty():
            idx, res = results.get()
            if isinstance(res, Exception):
                out = res
                break
            out[idx] = res
        global_results_queue.put(out)

    W.write_preloaded_data_multiproc = staticmethod(write_in_thread)
    W._tandem_no_fork = True


def save_sharded(state: dict, path: str) -> str:
    """All ranks: `state` (ShardedTensors / ShardedObjects + plain common values) -> `path`."""
    from megatron.core import dist_checkpointing

    _write_without_fork()
    path = os.path.abspath(path)
    tmp, old = f"{path}.tmp", f"{path}.old"
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if rank0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    _barrier()
    dist_checkpointing.save(state, tmp)
    _barrier()
    if rank0:
        with open(os.path.join(tmp, DONE), "w") as f:
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return path


def is_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, DONE))


def load_sharded(template: dict, path: str) -> dict:
    """All ranks: fill `template` (the same structure save_sharded got) from `path`."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.core import CheckpointingException

    if not is_checkpoint(path):
        raise FileNotFoundError(f"{path!r} is not a complete Tandem checkpoint directory")
    try:
        return dist_checkpointing.load(template, path)
    except CheckpointingException as e:  # e.g. a checkpoint of another model shape
        raise ValueError(f"checkpoint {path!r} does not fit: {e}") from None


def _trained_template(models: dict, optimizer, is_loading: bool) -> dict:
    state = {name: m.sharded_state_dict(prefix=f"{name}.") for name, m in models.items()}
    if optimizer is not None:
        trained = next(iter(models))  # the first model is the one the optimizer trains
        state["optimizer"] = optimizer.sharded_state_dict(state[trained], is_loading=is_loading)
    return state


def save_models(path: str, models: dict, optimizer, meta: dict) -> str:
    """All ranks: models (name -> GPTModel, the trained one first), its optimizer, and meta.
    An optimizer that has not stepped yet has no state to save (a fresh one equals it)."""
    stepped = optimizer.steps > 0
    state = _trained_template(models, optimizer if stepped else None, is_loading=False)
    state["meta"] = dict(meta, optimizer_steps=optimizer.steps, optimizer_format=optimizer.checkpoint_format)
    return save_sharded(state, path)


def load_models(path: str, models: dict, optimizer) -> dict:
    """All ranks: the inverse of save_models (any TP / DP layout); -> meta."""
    from megatron.core import dist_checkpointing

    if not is_checkpoint(path):
        raise FileNotFoundError(f"{path!r} is not a complete Tandem checkpoint directory")
    saved = dist_checkpointing.load_common_state_dict(path)["meta"]
    steps = int(saved["optimizer_steps"])
    fmt = saved.get("optimizer_format", "plain")  # checkpoints from before the key: the plain optimizer
    if steps > 0 and fmt != optimizer.checkpoint_format:
        raise ValueError(f"its optimizer state is in the {fmt} optimizer's format and this role uses the "
                         f"{optimizer.checkpoint_format} one (megatron.use_distributed_optimizer must be "
                         f"{str(fmt == 'distributed').lower()} to load it)")
    template = _trained_template(models, optimizer if steps > 0 else None, is_loading=True)
    template["meta"] = {}
    state = load_sharded(template, path)
    for name, model in models.items():
        model.load_state_dict(strip_prefix(state[name], f"{name}."))
    if steps > 0:
        optimizer.load_state_dict(state["optimizer"], steps)
    else:
        optimizer.reset()
    return state["meta"]


def strip_prefix(state: dict, prefix: str) -> dict:
    """Loaded sharded state keeps the prefix it was saved under; load_state_dict wants none."""
    return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state.items()}


def model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by name, without megatron's `_extra_state` entries."""
    return {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
