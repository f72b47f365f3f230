"""The same-host transport's shared export buffer: the source's side (`ExportBuffer`) and a
reader's (`SharedReader`).

The source keeps ONE allocation across versions (a new one only when the layout's size
changes or the source restarts, each with a new `buffer_id`): the flat layout, then a stamp
slot (an int64). It is shared once per allocation: CUDA IPC fields on a GPU (tandem/weights/ipc.py),
a shared-memory file on a CPU host (the same protocol, so CPU tests run every step of it but the
handle). A reader opens it once and keeps the mapping while the source answers with the same
`buffer_id`: a sync is one RPC (ShareWeights) and one copy.

Why a reader never takes a half-written version, with no second RPC: every write of a version
into the buffer is a seqlock. The source sets the stamp to WRITING, copies the bytes, then sets
the stamp to this write's number (on a GPU each step is a kernel on one stream, finished before
the next starts). The reader reads the stamp, copies the layout into its own staging buffer,
reads the stamp again; if either is not the number the source announced for the version, the
buffer was rewritten meanwhile (another replica asked for a newer version) and the sync is
aborted before anything is swapped: the old weights keep serving. The reader also compares a
word sum of what it copied with the source's (a cheap checksum: one read of the bytes).
"""
from __future__ import annotations

import os
import tempfile
import uuid
import weakref
from dataclasses import dataclass, field

import torch

from tandem.parallel import device
from tandem.weights.layout import ALIGN

WRITING = -1  # the stamp while a version is being written
STAMP_BYTES = ALIGN  # the slot after the layout (keeps the allocation a multiple of ALIGN)


def word_sum(flat: torch.Tensor) -> torch.Tensor:
    """The sum of a byte range read as int64 words, wrapping (0-d, on its device; no sync): exact
    integer arithmetic, so the same bytes give the same sum in any order of reduction. The
    range's size is a multiple of 8 (layouts are multiples of ALIGN)."""
    return flat.view(torch.int64).sum()


def _shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


class ExportBuffer:
    """The source's export allocation for layouts of `total_bytes` on `dev`."""

    def __init__(self, total_bytes: int, dev: torch.device):
        self.total_bytes, self.size = total_bytes, total_bytes + STAMP_BYTES
        self.buffer_id = uuid.uuid4().hex
        self.shm_path = ""
        if dev.type == "cpu":
            fd, self.shm_path = tempfile.mkstemp(prefix=f"tandem-weights-{self.buffer_id}-", dir=_shm_dir())
            os.ftruncate(fd, self.size)
            os.close(fd)
            weakref.finalize(self, _unlink, self.shm_path)
            self.buffer = torch.from_file(self.shm_path, shared=True, size=self.size, dtype=torch.uint8)
        else:
            self.buffer = torch.empty(self.size, dtype=torch.uint8, device=dev)
        self.flat = self.buffer[:total_bytes]
        self._slot = self.buffer[total_bytes: total_bytes + 8].view(torch.int64)
        self._slot.fill_(WRITING)
        self.stamp, self.word_sum = WRITING, 0
        self._fields: dict | None = None

    def write(self, copies: list[torch.Tensor], tensors: list[torch.Tensor], stamp: int) -> None:
        """Copy a version in (`copies`: views of `flat`), under the seqlock stamp."""
        self.stamp = WRITING
        self._slot.fill_(WRITING)
        torch._foreach_copy_(copies, tensors)
        total = word_sum(self.flat)
        self._slot.fill_(stamp)
        self.word_sum = int(total)  # synchronizes: every write above is done
        device.synchronize()
        self.stamp = stamp

    def invalidate(self) -> None:
        """Mark the buffer as holding no version (a write found torn after the fact)."""
        self.stamp = WRITING
        self._slot.fill_(WRITING)
        device.synchronize()

    def handle(self) -> dict:
        """The CUDA IPC fields of the whole allocation (computed once: torch registers a
        reference counter and an event per share); {} on CPU (the reader opens `shm_path`)."""
        if self.shm_path:
            return {}
        if self._fields is None:
            from tandem.weights import ipc

            self._fields = ipc.share(self.buffer)
        return self._fields


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


@dataclass
class ShareReply:
    """ShareWeightsResponse as values (tandem/weights/wire.py converts)."""
    weights_version: int
    buffer_id: str
    buffer_bytes: int
    total_bytes: int
    stamp: int
    word_sum: int
    layout: str
    device_uuid: str = ""
    manifest: object = None  # Manifest, when the reader's known layout differs
    fields: dict = field(default_factory=dict)  # CUDA IPC fields, when the reader's known buffer differs
    shm_path: str = ""


class SharedReader:
    """A reader's mapping of the source's buffer, kept while its buffer_id stays the same."""

    def __init__(self):
        self.buffer_id: str | None = None
        self.buffer: torch.Tensor | None = None

    def open(self, reply: ShareReply) -> bool:
        """Map the source's buffer unless it is the one already mapped; -> whether it opened one."""
        if reply.buffer_id == self.buffer_id:
            return False
        self.buffer_id, self.buffer = None, None  # a new buffer (a restarted source): the old mapping goes
        if reply.shm_path:
            if not os.path.isfile(reply.shm_path) or os.path.getsize(reply.shm_path) != reply.buffer_bytes:
                raise ValueError(f"ipc: the source's shared buffer {reply.shm_path} is not on this host "
                                 f"(or not {reply.buffer_bytes} bytes)")
            buffer = torch.from_file(reply.shm_path, shared=True, size=reply.buffer_bytes, dtype=torch.uint8)
        elif reply.fields:
            from tandem.weights import ipc

            index = device.index_of_uuid(reply.device_uuid)
            if index is None:
                raise ValueError(f"ipc: the source's GPU {reply.device_uuid} is not visible to this rank")
            buffer = ipc.open_tensor(reply.fields, torch.uint8, (reply.buffer_bytes,), index)
        else:
            raise ValueError(f"ipc: the source sent no handle for buffer {reply.buffer_id}, which this rank "
                             "has not opened")
        self.buffer, self.buffer_id = buffer, reply.buffer_id
        return True

    def copy_into(self, dst: torch.Tensor, reply: ShareReply) -> tuple[str | None, float, float]:
        """Copy the layout into `dst`, then check it: -> (problem or None, copy seconds, check
        seconds). A problem: the stamps show the buffer was rewritten, or the word sums differ."""
        import time

        n = reply.total_bytes
        slot = self.buffer[n: n + 8].view(torch.int64)
        t0 = time.perf_counter()
        before = slot.clone()
        dst.copy_(self.buffer[:n])
        after = slot.clone()
        device.synchronize()
        t1 = time.perf_counter()
        got_before, got_after, got_sum = torch.stack([before[0], after[0], word_sum(dst)]).tolist()
        t2 = time.perf_counter()
        if got_before != reply.stamp or got_after != reply.stamp:
            return (f"the source's buffer was rewritten during the copy (stamp {got_before} -> {got_after}, "
                    f"version {reply.weights_version} had {reply.stamp}): a newer version is being exported; "
                    "sync again"), t1 - t0, t2 - t1
        if got_sum != reply.word_sum:
            return (f"the copied bytes' word sum {got_sum} is not the source's {reply.word_sum} "
                    f"(version {reply.weights_version})"), t1 - t0, t2 - t1
        return None, t1 - t0, t2 - t1
