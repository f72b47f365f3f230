"""The weight plane's CPU bookkeeping: the flat layout, its manifest check, the chunk framing
(against protobuf's own encoding), the transport choice, the TP=1 -> TP shard views and the
controller's split of a batch over rollout replicas."""
import dataclasses

import pytest
import torch

from tandem.convert.reshard import shard_pairs, tp1_shape, tp1_tensor
from tandem.models.mapping import QKV, Direct, GatedMLP
from tandem.weights import transport as T
from tandem.weights import wire
from tandem.weights.layout import ALIGN, Manifest, byte_view, pieces, ranges, views


def manifest(version=3):
    return Manifest.build(version, [("a", torch.float32, (3, 5)), ("b", torch.bfloat16, (7,)),
                                    ("c", torch.float32, (2, 2))])


def test_layout_offsets_are_aligned_and_views_round_trip():
    m = manifest()
    assert [t.offset for t in m.tensors] == [0, ALIGN, 2 * ALIGN] and m.total_bytes == 3 * ALIGN
    tensors = [torch.randn(3, 5), torch.randn(7).bfloat16(), torch.randn(2, 2)]
    buf = torch.zeros(m.total_bytes, dtype=torch.uint8)
    for spec, t in zip(m.tensors, tensors):
        buf[spec.offset: spec.offset + spec.nbytes] = byte_view(t)
    assert all(torch.equal(v, t) for v, t in zip(views(buf, m), tensors))
    # pieces of a range that spans padding and two tensors
    assert list(pieces(m, 50, ALIGN + 4)) == [(0, 50, 60), (1, 0, 4)]
    assert ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]


def test_manifest_mismatch_names_the_tensor():
    want = manifest()
    assert manifest(version=9).mismatch(want) is None  # the version is checked elsewhere
    renamed = Manifest.build(3, [("a", torch.float32, (3, 5)), ("x", torch.bfloat16, (7,)), ("c", torch.float32, (2, 2))])
    assert "missing tensors ['b'], unexpected tensors ['x']" in renamed.mismatch(want)
    reshaped = Manifest.build(3, [("a", torch.float32, (3, 6)), ("b", torch.bfloat16, (7,)), ("c", torch.float32, (2, 2))])
    assert "'a' has shape [3, 6], expected [3, 5]" in reshaped.mismatch(want)
    retyped = Manifest.build(3, [("a", torch.float16, (3, 5)), ("b", torch.bfloat16, (7,)), ("c", torch.float32, (2, 2))])
    assert "'a' has dtype torch.float16" in retyped.mismatch(want)
    moved = Manifest(3, (want.tensors[0], dataclasses.replace(want.tensors[1], offset=8), want.tensors[2]),
                     want.total_bytes)
    assert "'b' at offset 8" in moved.mismatch(want)


@pytest.mark.parametrize("offset,size", [(0, 0), (0, 5), (300, 1 << 20), (2**40, 3)])
def test_chunk_framing_is_protobufs_encoding(offset, size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    fast = wire.chunk_message(offset, [data[: size // 2], data[size // 2:]])
    pb = wire.weights_pb2.StreamWeightsResponse(chunk=wire.weights_pb2.WeightsChunk(offset=offset, data=data))
    assert wire.weights_pb2.StreamWeightsResponse.FromString(fast) == pb
    kind, got_offset, view = wire.parse_stream_message(pb.SerializeToString())
    assert (kind, got_offset, bytes(view)) == ("chunk", offset, data)
    kind, got_offset, view = wire.parse_stream_message(fast)
    assert (kind, got_offset, bytes(view)) == ("chunk", offset, data)


def test_stream_manifest_and_end_messages_parse():
    m = manifest()
    assert wire.parse_stream_message(wire.manifest_message(m).SerializeToString()) == ("manifest", m)
    assert wire.parse_stream_message(wire.end_message(3, 768).SerializeToString()) == ("end", 3, 768)
    with pytest.raises(wire.InvalidArgument, match="not a StreamWeightsResponse"):
        wire.parse_stream_message(b"\x07garbage")


def test_transport_names_are_the_configs():
    from tandem.config import WEIGHT_TRANSPORTS

    assert set(T.CONFIG_VALUES) == set(WEIGHT_TRANSPORTS)


def test_transport_pick():
    gpu0 = T.Placement("h", "cuda", "GPU-0", True)
    gpu1, cpu = T.Placement("h", "cuda", "GPU-1", True), T.Placement("h", "cpu", "", False)
    assert T.pick(None, gpu0, [gpu0]) == T.IPC
    assert T.pick(None, gpu0, [gpu1, T.Placement("h", "cuda", "GPU-2", True)]) == T.COLLECTIVE
    assert T.pick(None, gpu0, [gpu0, gpu1]) == T.STREAM  # mixed: no transport but the stream fits all
    assert T.pick(None, cpu, [cpu]) == T.STREAM and T.backend(cpu) == "gloo"
    assert T.pick(None, gpu0, [T.Placement("other", "cuda", "GPU-0", True)]) == T.COLLECTIVE  # same UUID elsewhere
    assert T.problem(T.COLLECTIVE, gpu0, [gpu0]) and T.problem(T.COLLECTIVE, cpu, [gpu1])
    # ipc from a CPU source: a shared-memory file, for ranks on its host and on CPU only (never auto)
    assert T.problem(T.IPC, cpu, [cpu]) is None and T.problem(T.IPC, cpu, [gpu1])
    assert T.problem(T.IPC, cpu, [T.Placement("other", "cpu", "", False)]) and T.problem(T.IPC, gpu0, [cpu])
    assert T.problem(T.COLLECTIVE, cpu, [cpu, cpu]) is None and T.problem(T.STREAM, gpu0, [cpu]) is None
    assert T.pick(T.STREAM, gpu0, [gpu0]) == T.STREAM


def test_shard_pairs_invert_tp1_tensor():
    g = torch.Generator().manual_seed(0)
    cases = [(Direct("e", "e", 0), (8, 6)), (Direct("p", "p", 1), (6, 8)), (Direct("n", "n"), (6,)),
             (QKV("qkv", "q", "k", "v", 4, 2, 3), (2 * (2 * 3 + 6), 6)), (GatedMLP("fc1", "g", "u"), (16, 6))]
    for m, local in cases:
        for tp in (1, 2):
            shards = [torch.randn(local, generator=g) for _ in range(tp)]
            replicated = isinstance(m, Direct) and m.split_dim is None
            if replicated:
                shards = [shards[0]] * tp
            full = tp1_tensor(m, shards) if tp > 1 and not replicated else shards[0]
            assert tuple(full.shape) == tp1_shape(m, local, tp)
            for r in range(tp):
                param = torch.empty(local)
                pairs = shard_pairs(m, full, param, r, tp)
                torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])
                assert torch.equal(param, shards[r]), (m, tp, r)


def test_split_prompts_balances_tokens_and_keeps_order():
    from tandem.controller.rollout_replicas import replica_roles, split_prompts

    assert split_prompts([1] * 8, 2) == [(0, 4), (4, 8)]
    assert split_prompts([10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [(0, 1), (1, 11)]  # 10 | 10
    assert split_prompts([4, 4, 1, 1, 1, 1, 1], 2) == [(0, 2), (2, 7)]  # 8 | 5 beats 4 | 9
    assert [b - a for a, b in split_prompts([5, 5], 4)] in ([0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 1, 0])
    parts = split_prompts(list(range(1, 40)), 3)
    assert parts[0][0] == 0 and parts[-1][1] == 39 and all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert replica_roles(3) == ["rollout", "rollout-1", "rollout-2"]


def test_stream_parts_cover_the_layout():
    from tandem.weights.streams import parts

    mib = 1 << 20
    assert parts(10 * mib + 5, 2) == [(0, 6 * mib), (6 * mib, 10 * mib + 5)]
    assert parts(3 * mib, 4) == [(0, mib), (mib, 2 * mib), (2 * mib, 3 * mib)]  # no part under 1 MiB
    assert parts(100, 4) == [(0, 100)] and parts(0, 2) == [(0, 0)]
