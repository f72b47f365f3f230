"""Checkpoints: megatron-core dist_checkpointing directories, written atomically.

Every rank writes its shards into `<path>.tmp`; once all have, rank 0 swaps the finished
directory into place, so a crash mid-save leaves the previous checkpoint intact; a save that
fails removes its `<path>.tmp`, and one that cannot fit is refused before it writes anything
(tandem/checkpoint_room.py). Loading reshards: a checkpoint saved at one TP / DP layout loads
at another; one of another model shape or another role is refused before anything is read
(naming a tensor that does not fit), and so is one with a NaN or inf weight (naming it)
before any is used.
"""
from __future__ import annotations

import os
import shutil

import torch
import torch.distributed as dist

from tandem import checkpoint_room

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
    needed, free = checkpoint_room.measure(state, path)
    if free < needed:
        raise checkpoint_room.no_room(path, needed, free)
    try:
        if rank0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        _barrier()
        dist_checkpointing.save(state, tmp)
        _barrier()
    except BaseException as e:  # torch's CheckpointException is a BaseException
        free_at_failure = checkpoint_room.free_bytes(tmp)
        if rank0:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise checkpoint_room.save_failed(path, e, needed, free_at_failure) from e
    if rank0:
        with open(os.path.join(tmp, DONE), "w") as f:
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):
            shutil.rmtree(old, ignore_errors=True)  # left by a crash between the two renames
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return path


def is_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, DONE))


def load_sharded(template: dict, path: str) -> dict:
    """All ranks: fill `template` (the same structure save_sharded got) from `path`.
    ValueError naming the tensor when the checkpoint cannot fill it (another model shape,
    another role's checkpoint): every TP / PP / DP / EP layout reshards, nothing else does."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.core import CheckpointingException
    from torch.distributed.checkpoint.api import CheckpointException

    if not is_checkpoint(path):
        raise FileNotFoundError(f"{path!r} is not a complete Tandem checkpoint directory")
    check_fits(template, path)
    try:
        return dist_checkpointing.load(template, path)
    except (CheckpointingException, CheckpointException) as e:  # (torch's is a BaseException)
        raise ValueError(f"checkpoint {path!r} does not fit: {e}") from None


def _same_shape(saved: tuple, here: tuple, padded_rows: bool) -> bool:
    """Equal global shapes; where megatron allows a mismatch (a padded vocabulary, or a critic's
    one-row value head taking a slice of a policy's output layer) only the rows may differ."""
    return saved == here or (padded_rows and len(saved) == len(here) and saved[1:] == here[1:])


def check_fits(template: dict, path: str) -> None:
    """Every tensor `template` loads is in the checkpoint at `path` with the same global shape
    (before anything is read or any rank waits on another); ValueError naming the first misfits."""
    from megatron.core.dist_checkpointing import load_tensors_metadata
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    saved = load_tensors_metadata(path)
    missing, misshaped = [], []
    for sh in nested_values(template):
        if not isinstance(sh, ShardedTensor):
            continue
        if sh.key not in saved:
            missing.append(sh.key)
        elif not _same_shape(tuple(saved[sh.key].global_shape), tuple(sh.global_shape), sh.allow_shape_mismatch):
            misshaped.append(f"{sh.key!r} is {list(saved[sh.key].global_shape)} there, {list(sh.global_shape)} here")
    if misshaped:
        raise ValueError(f"checkpoint {path!r} is of another model shape: {'; '.join(misshaped[:3])}"
                         + (f" (and {len(misshaped) - 3} more)" if len(misshaped) > 3 else ""))
    if missing:
        some = sorted(k for k in saved if not k.endswith("_extra_state"))[:3]
        raise ValueError(f"checkpoint {path!r} has no {missing[0]!r}"
                         + (f" (and {len(missing) - 1} more tensors)" if len(missing) > 1 else "")
                         + f"; it holds e.g. {some}: another role's or another model's checkpoint")


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
    state = load_sharded(stage_on_host(template), path)
    check_finite(state, path)
    for name, model in models.items():
        model.load_state_dict(strip_prefix(state[name], f"{name}."))
    if steps > 0:
        optimizer.load_state_dict(state["optimizer"], steps)
    else:
        optimizer.reset()
    return state["meta"]


def stage_on_host(template: dict) -> dict:
    """`template` with every ShardedTensor on a fresh host buffer: dist_checkpointing loads in
    place, so without this a load writes into the live parameters and optimizer state before
    anything is checked. The caller copies the checked values in (load_state_dict)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    for sh in nested_values(template):  # (a factory, e.g. SwiGLU's fc1, builds its tensors from .data)
        if isinstance(sh, (ShardedTensor, ShardedTensorFactory)) and isinstance(sh.data, torch.Tensor):
            sh.data = torch.empty(sh.data.shape, dtype=sh.data.dtype)
    return template


def check_finite(state: dict, path: str) -> None:
    """All ranks: ValueError naming a tensor of a loaded state (nested dicts) with NaN or inf,
    on every rank (each holds only its shards; no rank may use what it loaded if another refuses)."""
    bad = next((k for k, t in _tensors(state) if t.is_floating_point() and not bool(torch.isfinite(t).all())), None)
    found = [bad]
    if dist.is_initialized() and dist.get_world_size() > 1:
        found = [None] * dist.get_world_size()
        dist.all_gather_object(found, bad)
    bad = next((k for k in found if k is not None), None)
    if bad is not None:
        raise ValueError(f"checkpoint {path!r}: tensor {bad!r} contains NaN or inf")


def _tensors(x, where: str = ""):
    """(name, tensor) of every tensor in nested dicts / lists; a name is its key, or its path
    of keys where the key alone says little (optimizer state)."""
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, (list, tuple)) else ()
    for k, v in items:
        name = k if isinstance(k, str) and "." in k else f"{where}.{k}".lstrip(".")
        if isinstance(v, torch.Tensor):
            yield name, v
        else:
            yield from _tensors(v, name)


def strip_prefix(state: dict, prefix: str) -> dict:
    """Loaded sharded state keeps the prefix it was saved under; load_state_dict wants none."""
    return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state.items()}


def model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by name, without megatron's `_extra_state` entries."""
    return {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
