"""One rollout rank's side of a sync: a staging buffer the transports fill, then the swap.

Every rank holds a flat byte buffer of the TP=1 layout (tandem/weights/layout.py) beside its
model. A sync fills it (stream chunks land on the front rank and are broadcast to the others
over the rollout's own group at commit; IPC copies and collective broadcasts land on every
rank; IPC reads the source's shared buffer, tandem/weights/shared.py), and only once the
whole version is there and checked does `commit` copy each rank's
shard into the parameters in place (tandem/convert/reshard.py `shard_pairs`: views, no
allocation), on the worker thread between two generations. The parameters' storage never
changes (the engine's CUDA graphs and fused-step references point at it), and a sync that
fails before the commit leaves the old weights serving.

Costs one TP=1 copy of the model per rank (a TP > 1 rollout could stage its shard only; not
done). Methods other than the `write*` ones run on every rank through the rank group.
"""
from __future__ import annotations

import hashlib
import time

import numpy as np
import torch
import torch.distributed as dist

from tandem.convert.reshard import shard_pairs, tp1_shape
from tandem.models.registry import weight_mappings
from tandem.parallel import device
from tandem.weights import transport
from tandem.weights.group import WeightGroup
from tandem.weights.layout import Manifest, ranges, views
from tandem.weights.shared import SharedReader, ShareReply

HOST_BLOCK = 32 << 20  # stream chunks gather in pinned host blocks of this size before a device copy


class WeightStaging:
    def __init__(self, model, shape, worker):
        from megatron.core import parallel_state as ps

        self.model, self.shape, self.worker = model, shape, worker
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.tp = ps.get_tensor_model_parallel_world_size()
        params = dict(model.named_parameters())
        self.mappings = list(weight_mappings(shape))
        uncovered = sorted(set(params) - {m.megatron for m in self.mappings})
        missing = [m.megatron for m in self.mappings if m.megatron not in params]
        if uncovered or missing:
            raise ValueError(f"rollout model vs weight table: parameters {uncovered[:5]} not in the table, "
                             f"table entries {missing[:5]} not in the model")
        self.params = [params[m.megatron] for m in self.mappings]
        self.expected = Manifest.build(-1, [(m.megatron, p.dtype, tp1_shape(m, p.shape, self.tp))
                                            for m, p in zip(self.mappings, self.params)])
        self.buffer: torch.Tensor | None = None
        self.group: WeightGroup | None = None
        self.shared = SharedReader()  # the source's export buffer, mapped while its id holds (ipc)

    # ---- every rank (through the rank group) ---------------------------------------------
    def placement(self) -> transport.Placement:
        return transport.local_placement()

    def prepare(self) -> None:
        if self.buffer is None:
            self.buffer = torch.empty(self.expected.total_bytes, dtype=torch.uint8, device=device.device())

    def receive_shared(self, reply: ShareReply) -> dict:
        """Copy the source's shared buffer (same layout; mapped once per buffer_id, tandem/weights/shared.py)
        into the staging buffer and check the copy: -> {"problem": str | None, "opened": bool, and
        seconds "open", "copy", "check"}. A problem leaves the parameters untouched (no commit)."""
        if reply.total_bytes != self.expected.total_bytes:
            raise ValueError(f"ipc: the source's layout is {reply.total_bytes} bytes, this model's "
                             f"{self.expected.total_bytes}")
        self.prepare()
        t0 = time.perf_counter()
        opened = self.shared.open(reply)
        t1 = time.perf_counter()
        problem, copy_s, check_s = self.shared.copy_into(self.buffer, reply)
        return {"problem": problem, "opened": opened, "open": t1 - t0, "copy": copy_s, "check": check_s}

    def join(self, group_id: str, host: str, port: int, size: int, backend: str, timeout_s: float) -> None:
        """Join the weight group as rank 1 + this rank (the source is rank 0)."""
        self.leave()
        self.group = WeightGroup(group_id, host, port, 1 + dist.get_rank(), size, backend, timeout_s)
        self.group.warm_up(device.device())

    def leave(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    def receive_broadcast(self, bucket_bytes: int) -> None:
        if self.group is None:
            raise ValueError("collective: this rank is in no weight group")
        self.prepare()
        try:
            for a, b in ranges(self.expected.total_bytes, bucket_bytes):
                self.group.broadcast(self.buffer[a:b])
            device.synchronize()
        except RuntimeError:
            self.leave()  # a peer died or timed out: the group is unusable
            raise

    @torch.no_grad()
    def commit(self, version: int, from_front: bool) -> int:
        """Swap to the staged version: every shard copied into its parameter in place."""
        self.prepare()
        if from_front and dist.get_world_size() > 1:  # the stream landed on the front rank only
            dist.broadcast(self.buffer, src=0)
        dst, src = [], []
        for m, param, full in zip(self.mappings, self.params, views(self.buffer, self.expected)):
            for d, s in shard_pairs(m, full, param, self.tp_rank, self.tp):
                dst.append(d)
                src.append(s)
        torch._foreach_copy_(dst, src)
        device.synchronize()
        self.worker.weights_version = version
        return version

    def digest(self) -> dict[str, str]:
        """SHA-256 of each parameter in the TP=1 layout (gathered over the TP group)."""
        from tandem.convert.reshard import tp1_weights

        out = {}
        for name, t in tp1_weights(self.model, self.shape).items():
            t = t.detach().contiguous().cpu()
            out[name] = hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        return out

    # ---- the front rank: stream chunks ---------------------------------------------------
    def writer(self) -> HostWriter:
        """A writer of one stream's chunks into the buffer (one per stream: they run in parallel)."""
        self.prepare()
        return HostWriter(self.buffer)


class HostWriter:
    """Bytes [offset, offset + n) of the flat layout, written in order: straight into a host
    buffer, or gathered in two pinned host blocks whose copies to the device overlap the
    filling of the other."""

    def __init__(self, buffer: torch.Tensor):
        self.buffer = buffer
        self.host = buffer.numpy() if buffer.device.type == "cpu" else None
        if self.host is None:
            self.blocks = [device.pinned_empty(HOST_BLOCK) for _ in range(2)]
            self.views = [b.numpy() for b in self.blocks]
            self.copied = [None, None]  # per block: the event of its last device copy
        self.start, self.fill, self.which = 0, 0, 0

    def write(self, offset: int, data: memoryview) -> None:
        n = len(data)
        if self.host is not None:
            self.host[offset: offset + n] = np.frombuffer(data, dtype=np.uint8)
            return
        if self.fill + n > HOST_BLOCK or (self.fill and offset != self.start + self.fill):
            self._flush()
        if n > HOST_BLOCK:  # a chunk larger than a block goes on its own
            self.buffer[offset: offset + n].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
            return
        if self.fill == 0:
            self.start = offset
        self.views[self.which][self.fill: self.fill + n] = np.frombuffer(data, dtype=np.uint8)
        self.fill += n

    def _flush(self) -> None:
        """Copy the filled block to the device (asynchronously) and switch to the other block
        once its own last copy has finished."""
        if self.fill:
            block = self.blocks[self.which][: self.fill]
            self.buffer[self.start: self.start + self.fill].copy_(block, non_blocking=True)
            self.copied[self.which] = device.record_event()
            self.which ^= 1
            if self.copied[self.which] is not None:
                self.copied[self.which].synchronize()
        self.fill = 0

    def close(self) -> None:
        if self.host is None:
            self._flush()
            device.synchronize()
