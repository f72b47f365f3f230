"""The one place that decides device and dtype.

Everything else asks this module for the device (`device()`), the parameter dtype
(`parse_dtype()`), copies and synchronisation, and must never call `torch.cuda.*`
directly. megatron-core's own CUDA assumptions are handled by `cpu_compat.py`.
"""
from __future__ import annotations

import contextlib

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
    """A dtype by name; "auto" (megatron.dtype's default) is bfloat16 with CUDA, float32 on CPUs,
    where megatron-core's bf16 optimizer cannot run."""
    if name == "auto":
        return torch.bfloat16 if has_cuda() else torch.float32
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {sorted(_DTYPES)} or auto") from None


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


class CopyStream:
    """Copies that may overlap the current stream's work: on a side stream with CUDA (after the
    current stream's queued work), inline on CPU. `record()` -> an event to wait on (None on CPU)."""

    def __init__(self):
        self.stream = torch.cuda.Stream() if has_cuda() else None

    @contextlib.contextmanager
    def run(self):
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            yield

    def record(self):
        return self.stream.record_event() if self.stream is not None else None


def wait_on_device(event) -> None:
    """The current stream waits for `event` (the host does not)."""
    if event is not None:
        torch.cuda.current_stream().wait_event(event)


def wait_on_host(event) -> None:
    if event is not None:
        event.synchronize()


def host_bytes(nbytes: int) -> torch.Tensor:
    """A host buffer of `nbytes` bytes, pinned with CUDA (so copies to and from it are asynchronous)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=has_cuda())


def empty_host_cache() -> None:
    """Give freed pinned host memory back to the OS (torch caches it like device memory)."""
    if has_cuda() and hasattr(torch._C, "_host_emptyCache"):
        torch._C._host_emptyCache()


def memory_peaks() -> tuple[int, int]:
    """(max allocated, max reserved) device bytes since the last `reset_memory_peaks` (0, 0 on CPU)."""
    if not has_cuda():
        return 0, 0
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


def reset_memory_peaks() -> None:
    if has_cuda():
        torch.cuda.reset_peak_memory_stats()


def memory_allocated() -> int:
    """Device bytes held by tensors now (0 on CPU)."""
    return torch.cuda.memory_allocated() if has_cuda() else 0


def manual_seed(seed: int) -> None:
    """Seed torch and megatron's model-parallel RNG tracker (CUDA or CPU)."""
    from megatron.core import tensor_parallel

    torch.manual_seed(seed)
    # On CPU the tracker installed by cpu_compat.install() forks the CPU RNG state.
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def set_memory_fraction(fraction: float | None) -> None:
    """Cap this process's share of its GPU (two services sharing one GPU each take a fraction;
    the caching allocator raises out-of-memory beyond it). None or CPU: no cap."""
    if fraction is not None and has_cuda():
        torch.cuda.set_per_process_memory_fraction(fraction)


def device_uuid() -> str:
    """This process's GPU, as a UUID that is the same in every process ("" on CPU)."""
    if not has_cuda():
        return ""
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


def index_of_uuid(uuid: str) -> int | None:
    """The index, in this process's numbering, of the GPU with `uuid` (None: not visible here)."""
    if not has_cuda() or not uuid:
        return None
    for i in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(i).uuid) == uuid:
            return i
    return None


def nccl_available() -> bool:
    import torch.distributed as dist

    return has_cuda() and dist.is_nccl_available()


def ipc_collect() -> None:
    """Free device memory that CUDA IPC readers have released (the source's old versions)."""
    if has_cuda():
        torch.cuda.ipc_collect()


def pinned_empty(nbytes: int) -> torch.Tensor:
    """A host byte buffer for device copies: pinned with CUDA (asynchronous copies), plain on CPU."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=has_cuda())


def record_event():
    """An event recorded on the current CUDA stream (wait on it with .synchronize()); None on CPU."""
    if not has_cuda():
        return None
    ev = torch.cuda.Event()
    ev.record()
    return ev
