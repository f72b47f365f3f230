"""CUDA IPC handles of tensors: what torch.multiprocessing does for a CUDA tensor, by hand.

The source shares each tensor with `share` (torch.multiprocessing.reductions.reduce_tensor:
a cudaIpcMemHandle of the allocation holding it, its offsets, torch's producer-side reference
counter and an event the reader waits on); the fields travel in a CudaIpcTensor message (no
pickle), and a process on the same GPU rebuilds a tensor over the same memory with `open`
(reductions.rebuild_cuda_tensor, which caches opened allocations). Nothing is copied until
the reader copies. The source's memory must stay allocated while a reader has it open: the
source keeps its version's tensors until that version is replaced, and the reader copies into
its own staging buffer and asks the source to confirm (ReleaseWeights) before it swaps.

GPU-only; nothing here runs on CPU hosts.
"""
from __future__ import annotations

import torch

FIELDS = ("storage_handle", "storage_size_bytes", "storage_offset_bytes", "tensor_offset",
          "ref_counter_handle", "ref_counter_offset", "event_handle", "event_sync_required")


def share(t: torch.Tensor) -> dict:
    """The IPC fields of a contiguous CUDA tensor (keys: FIELDS)."""
    from torch.multiprocessing.reductions import reduce_tensor

    if t.device.type != "cuda":
        raise ValueError("CUDA IPC shares CUDA tensors only")
    _, args = reduce_tensor(t.detach())
    (_, _, _, tensor_offset, _, _, _, handle, size_bytes, offset_bytes, _, ref_handle, ref_offset,
     event_handle, event_sync) = args
    return dict(storage_handle=handle, storage_size_bytes=size_bytes, storage_offset_bytes=offset_bytes,
                tensor_offset=tensor_offset, ref_counter_handle=ref_handle, ref_counter_offset=ref_offset,
                event_handle=event_handle or b"", event_sync_required=bool(event_sync))


def open_tensor(fields: dict, dtype: torch.dtype, shape: tuple[int, ...], device_index: int) -> torch.Tensor:
    """A tensor over the shared memory (device_index: the GPU holding it, in this process's
    numbering)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    stride = tuple(torch.empty(shape, device="meta").stride())
    return rebuild_cuda_tensor(
        torch.Tensor, torch.Size(shape), stride, fields["tensor_offset"], torch.storage.TypedStorage, dtype,
        device_index, fields["storage_handle"], fields["storage_size_bytes"], fields["storage_offset_bytes"],
        False, fields["ref_counter_handle"], fields["ref_counter_offset"], fields["event_handle"] or None,
        fields["event_sync_required"])
