"""The one place that decides device and dtype.

Everything else asks this module for the device (`device()`), the parameter dtype
(`parse_dtype()`), copies and synchronisation, and must never call `torch.cuda.*`
directly. megatron-core's own CUDA assumptions are handled by `cpu_compat.py`.
"""
from __future__ import annotations

import torch

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def has_cuda() -> bool:
    return torch.cuda.is_available()


def device() -> torch.device:
    """The compute device of this process (its local GPU, or the CPU)."""
    return torch.device("cuda", torch.cuda.current_device()) if has_cuda() else torch.device("cpu")


def backend() -> str:
    """torch.distributed backend for the device group."""
    return "nccl" if has_cuda() else "gloo"


def parse_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {sorted(_DTYPES)}") from None


def set_local_device(local_rank: int) -> None:
    if has_cuda():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())


def to_device(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """`t.to(dev)` without making the host wait for the device. A plain host-to-GPU copy
    from pageable memory synchronizes the stream, i.e. waits for all queued GPU work: ~10
    of those per training micro-batch left the GPU idle while the host prepared the next
    one. Here the copy goes through pinned memory, asynchronously (torch's pinned-memory
    cache keeps the staging buffer until the copy has run)."""
    if t.device.type != "cpu" or dev.type != "cuda":
        return t.to(dev)
    return t.pin_memory().to(dev, non_blocking=True)


def synchronize() -> None:
    if has_cuda():
        torch.cuda.synchronize()


def empty_cache() -> None:
    """Return cached, unused device memory to the driver (e.g. a released KV cache)."""
    if has_cuda():
        torch.cuda.empty_cache()


def manual_seed(seed: int) -> None:
    """Seed torch and megatron's model-parallel RNG tracker (CUDA or CPU)."""
    from megatron.core import tensor_parallel

    torch.manual_seed(seed)
    # On CPU the tracker installed by cpu_compat.install() forks the CPU RNG state.
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
