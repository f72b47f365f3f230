"""Hypothesis strategies of malformed and adversarial requests for every RPC of the tandem.v1
services, from the protos' descriptors.

Three kinds, for each RPC (`rpcs()` lists them from the descriptor pool):
- `from_descriptor`: a message of the request type with any values in any field (extreme
  integers, NaN / inf, unknown enum values, odd strings, nested messages, a random Struct);
- `mutated`: a valid request of the RPC (made from real calls, tests/helpers/fuzz_targets.py)
  with one to three mutations of its batch, weights, sampling settings or path: wrong
  dtypes, shapes and sizes, huge or negative dimensions, truncated bytes, NaN / inf, token
  ids out of range, odd mask values, duplicated or empty names, dropped tensors, rows that
  disagree, odd meta values, longer sequences and more rows;
- `corrupted`: a valid request's bytes truncated, with bytes flipped, or with junk appended.

Every strategy yields `Case(rpc, payload bytes, how)`; `how` names what was done, for reports.
Deliberately not here: the valid requests and sending (fuzz_targets.py), what counts as a
good answer (the callers).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from google.protobuf import descriptor, descriptor_pool, message_factory
from hypothesis import strategies as st

from tandem.v1 import actor_pb2, critic_pb2, data_pb2, reward_pb2, rollout_pb2, weights_pb2  # noqa: F401  (fill the pool)

SERVICES = ("tandem.v1.ActorService", "tandem.v1.RolloutService", "tandem.v1.CriticService",
            "tandem.v1.RewardService")
# RPCs whose request names an address the service then connects to (a weight source, a
# rendezvous store): fuzzing them would have the services dial arbitrary hosts and ports, and
# wait out arbitrary timeouts. Not fuzzed; their argument checks have their own tests.
DIALING = frozenset({"RolloutService.SyncWeights", "ActorService.JoinWeightGroup"})
FD = descriptor.FieldDescriptor
INT_RANGES = {FD.TYPE_INT32: (-2**31, 2**31 - 1), FD.TYPE_SINT32: (-2**31, 2**31 - 1),
              FD.TYPE_SFIXED32: (-2**31, 2**31 - 1), FD.TYPE_UINT32: (0, 2**32 - 1),
              FD.TYPE_FIXED32: (0, 2**32 - 1), FD.TYPE_INT64: (-2**63, 2**63 - 1),
              FD.TYPE_SINT64: (-2**63, 2**63 - 1), FD.TYPE_SFIXED64: (-2**63, 2**63 - 1),
              FD.TYPE_UINT64: (0, 2**64 - 1), FD.TYPE_FIXED64: (0, 2**64 - 1)}
ODD_FLOATS = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, -1.0, 1e-45, 1e38, -1e38, 1e308, 2.5]
ODD_META = [float("nan"), float("inf"), -1.0, 0.0, 0.5, 1e300, 2.0**53 + 1, "abc", "", [1, 2], {"a": 1}, True, None]
SIZES = ("chunk_bytes", "start", "end", "bucket_bytes")
HUGE_DIMS = [2**31, 2**40, 2**62, 2**63 - 1, 10**6]


@dataclass(frozen=True)
class Rpc:
    service: str  # full name, e.g. tandem.v1.ActorService
    method: str
    request_cls: type
    streaming: bool = False  # the answer is a server stream

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.method}"

    @property
    def name(self) -> str:
        return f"{self.service.rsplit('.', 1)[-1]}.{self.method}"


@dataclass(frozen=True)
class Case:
    rpc: Rpc
    payload: bytes
    how: str


def rpcs() -> list[Rpc]:
    """Every RPC of every tandem.v1 service but the DIALING ones, from the descriptor pool."""
    pool = descriptor_pool.Default()
    out = [Rpc(name, m.name, message_factory.GetMessageClass(m.input_type), m.server_streaming)
           for name in SERVICES for m in pool.FindServiceByName(name).methods]
    return [r for r in out if r.name not in DIALING]


# ---- any message of a type, from its descriptor -------------------------------------------------

def _json_values(depth: int = 2):
    leaf = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=8),
                     st.sampled_from([x for x in ODD_META if not isinstance(x, float) or x == x]))
    if depth == 0:
        return leaf
    inner = _json_values(depth - 1)
    return st.one_of(leaf, st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3))


def _scalar(field: descriptor.FieldDescriptor):
    t = field.type
    if t in INT_RANGES:
        lo, hi = INT_RANGES[t]
        return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, 1, -1 if lo < 0 else 2]))
    if t in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return st.one_of(st.floats(width=64 if t == FD.TYPE_DOUBLE else 32), st.sampled_from(ODD_FLOATS))
    if t == FD.TYPE_BOOL:
        return st.booleans()
    if t == FD.TYPE_STRING:
        return st.one_of(st.text(max_size=40), st.sampled_from(["", "\x00", "../..", "a" * 5000]))
    if t == FD.TYPE_BYTES:
        return st.binary(max_size=300)
    if t == FD.TYPE_ENUM:
        return st.integers(-3, 20)  # proto3 enums are open: unknown values parse
    raise TypeError(f"field {field.full_name}: type {t}")


@st.composite
def _message(draw, desc: descriptor.Descriptor, depth: int):
    cls = message_factory.GetMessageClass(desc)
    msg = cls()
    if desc.full_name == "google.protobuf.Struct":
        msg.update(draw(st.dictionaries(st.text(max_size=12), _json_values(), max_size=4)))
        return msg
    for field in desc.fields:
        if not draw(st.booleans()):
            continue
        if field.type == FD.TYPE_MESSAGE:
            if depth <= 0:
                continue
            if field.message_type.GetOptions().map_entry:
                continue  # maps appear only in responses
            values = draw(st.lists(_message(field.message_type, depth - 1),
                                   max_size=3)) if _repeated(field) else [draw(_message(field.message_type, depth - 1))]
            for v in values:
                (getattr(msg, field.name).add().CopyFrom(v) if _repeated(field)
                 else getattr(msg, field.name).CopyFrom(v))
        elif _repeated(field):
            getattr(msg, field.name).extend(draw(st.lists(_scalar(field), max_size=4)))
        else:
            setattr(msg, field.name, draw(_scalar(field)))
    return msg


def _repeated(field) -> bool:
    return field.is_repeated


def from_descriptor(rpc: Rpc):
    return _message(rpc.request_cls.DESCRIPTOR, 4).map(
        lambda m: Case(rpc, m.SerializeToString(), "any message from the descriptor"))


# ---- valid requests, mutated -------------------------------------------------------------------

ITEMSIZE = {1: 4, 2: 2, 3: 2, 4: 8, 5: 8, 6: 4, 7: 2, 8: 1, 9: 1, 10: 1}
FMT = {1: "f", 4: "d", 5: "q", 6: "i", 7: "h", 8: "b", 9: "B", 10: "B"}


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _values(t: data_pb2.Tensor) -> list:
    n = len(t.data) // ITEMSIZE[t.dtype]  # whole items (an earlier mutation may have cut one)
    return list(struct.unpack(f"<{n}{FMT[t.dtype]}", t.data[:n * ITEMSIZE[t.dtype]]))


def _set_values(t: data_pb2.Tensor, values: list) -> None:
    t.data = struct.pack(f"<{len(values)}{FMT[t.dtype]}", *values)


def _tensor_mutation(draw, t: data_pb2.Tensor, vocab: int) -> str:
    """One mutation of tensor `t` (in place) -> its description."""
    kind = draw(st.sampled_from(["dtype", "shape", "huge_dim", "negative_dim", "truncate", "values", "name"]))
    if kind == "dtype":
        t.dtype = draw(st.integers(0, 12))
    elif kind == "shape":
        t.ClearField("shape")
        t.shape.extend(draw(st.lists(st.integers(0, 12), max_size=4)))
        if draw(st.booleans()) and t.dtype in ITEMSIZE:  # consistent bytes: only the shape is wrong
            t.data = draw(st.binary(min_size=_numel(t.shape) * ITEMSIZE[t.dtype],
                                    max_size=_numel(t.shape) * ITEMSIZE[t.dtype]))
    elif kind == "huge_dim" and len(t.shape):
        t.shape[draw(st.integers(0, len(t.shape) - 1))] = draw(st.sampled_from(HUGE_DIMS))
    elif kind == "negative_dim" and len(t.shape):
        t.shape[draw(st.integers(0, len(t.shape) - 1))] = draw(st.sampled_from([-1, -2**31, -2**63]))
    elif kind == "truncate":
        t.data = t.data[:draw(st.integers(0, max(0, len(t.data) - 1)))]
    elif kind == "values" and t.dtype in FMT and t.data:
        values = _values(t)
        odd = ([x for x in ODD_FLOATS if abs(x) < 3.4e38 or x != x or abs(x) == float("inf")] if t.dtype == 1
               else ODD_FLOATS if t.dtype == 4 else [0, 1, 2, 255] if t.dtype == 10
               else [-1, vocab, vocab + 7, 2, -2**31, 2**31 - 1, 0])
        for _ in range(draw(st.integers(1, 3))):
            value = draw(st.sampled_from(odd))
            if t.dtype in (8, 9, 10, 7, 6):
                value = max(min(value, {8: 127, 9: 255, 10: 255, 7: 2**15 - 1, 6: 2**31 - 1}[t.dtype]),
                            {8: -128, 9: 0, 10: 0, 7: -2**15, 6: -2**31}[t.dtype])
            values[draw(st.integers(0, len(values) - 1))] = value
        _set_values(t, values)
    elif kind == "name":
        t.name = draw(st.sampled_from(["", "input_ids", "attention_mask", "responses", "__row__", "x" * 300]))
    return f"{t.name or '<empty>'}:{kind}"


def _batch_mutation(draw, b: data_pb2.Batch, vocab: int) -> str:
    kind = draw(st.sampled_from(["tensor", "tensor", "tensor", "drop", "duplicate", "rows", "meta", "column",
                                 "longer", "more_rows", "empty"]))
    if kind == "tensor" and len(b.tensors):
        return "batch." + _tensor_mutation(draw, b.tensors[draw(st.integers(0, len(b.tensors) - 1))], vocab)
    if kind == "drop" and len(b.tensors) + len(b.columns):
        i = draw(st.integers(0, len(b.tensors) + len(b.columns) - 1))
        seq = b.tensors if i < len(b.tensors) else b.columns
        j = i if i < len(b.tensors) else i - len(b.tensors)
        name = seq[j].name
        del seq[j]
        return f"batch.drop {name}"
    if kind == "duplicate" and len(b.tensors):
        t = b.tensors[draw(st.integers(0, len(b.tensors) - 1))]
        (b.tensors.add() if draw(st.booleans()) else b.columns.add(values=["x"])).name = t.name
        return f"batch.duplicate {t.name}"
    if kind == "rows" and len(b.tensors) and len(b.tensors[0].shape) and b.tensors[0].shape[0] > 1:
        t = b.tensors[draw(st.integers(0, len(b.tensors) - 1))]
        if t.dtype in ITEMSIZE and len(t.shape) and all(0 <= d < 2**16 for d in t.shape):
            row = _numel(t.shape[1:]) * ITEMSIZE[t.dtype]
            t.shape[0] -= 1
            t.data = t.data[:len(t.data) - row]
        return f"batch.rows {t.name}"
    if kind == "meta":
        key = draw(st.sampled_from(["temperature", "rollout_n", "loss_units", "x"]))
        b.meta.update({key: draw(st.sampled_from(ODD_META))})
        return f"batch.meta {key}"
    if kind == "column" and len(b.columns):
        c = b.columns[draw(st.integers(0, len(b.columns) - 1))]
        what = draw(st.sampled_from(["json", "values", "fewer"]))
        if what == "json":
            c.json = not c.json
        elif what == "values" and len(c.values):
            c.values[draw(st.integers(0, len(c.values) - 1))] = draw(st.sampled_from(
                ["", "{", "null", "[1,2]", json.dumps({"a": [1]}), "x" * 100_000, "\x00", "\ud7ff"]))
        elif len(c.values):
            del c.values[-1]
        return f"batch.column {c.name}:{what}"
    if kind in ("longer", "more_rows") and not b.meta.fields.get("fuzz_grown"):
        b.meta.update({"fuzz_grown": True})  # once per request: a bigger request, not a slower service
        return "batch." + _grow(draw, b, kind)
    if kind in ("longer", "more_rows"):
        return "batch.grown once already"
    b.Clear()
    return "batch.empty"


def _grow(draw, b: data_pb2.Batch, kind: str) -> str:
    """Longer sequences (past the model's positions) or more rows, every tensor kept consistent."""
    factor = draw(st.sampled_from([2, 4, 8] if kind == "more_rows" else [2, 3]))
    for t in b.tensors:
        if t.dtype not in ITEMSIZE or not len(t.shape) or any(not 0 <= d < 2**16 for d in t.shape) \
                or len(t.data) != _numel(t.shape) * ITEMSIZE[t.dtype]:
            continue  # an earlier mutation already broke it
        if kind == "more_rows":
            t.data = t.data * factor
            t.shape[0] *= factor
        elif len(t.shape) == 2 and t.shape[1]:
            rows, width, size = t.shape[0], t.shape[1], ITEMSIZE[t.dtype]
            t.data = b"".join(t.data[r * width * size:(r + 1) * width * size] * factor for r in range(rows))
            t.shape[1] = width * factor
    if kind == "more_rows":
        for c in b.columns:
            values = list(c.values) * factor
            del c.values[:]
            c.values.extend(values)
    return f"{kind} x{factor}"


def _sampling_mutation(draw, s: rollout_pb2.SamplingParams) -> str:
    field = draw(st.sampled_from(["max_new_tokens", "n", "temperature", "top_p", "top_k", "seed", "stop_token_ids",
                                  "greedy"]))
    extremes = {"max_new_tokens": [-1, 0, 1, 40, 2**20, 2**31 - 1], "n": [-1, 0, 3, 2**20, 2**31 - 1],
                "temperature": ODD_FLOATS, "top_p": ODD_FLOATS, "top_k": [-1, 0, 1, 10**6, 2**31 - 1],
                "seed": [-2**63, 2**63 - 1, 0]}
    if field == "stop_token_ids":
        s.stop_token_ids.extend(draw(st.lists(st.sampled_from([-1, 0, 5, 10**6, 2**31 - 1]), min_size=1, max_size=3)))
    elif field == "greedy":
        s.greedy = not s.greedy
    else:
        setattr(s, field, draw(st.sampled_from(extremes[field])))
    return f"sampling.{field}"


def _weights_mutation(draw, w: data_pb2.NamedTensors, vocab: int) -> str:
    kind = draw(st.sampled_from(["tensor", "tensor", "drop", "duplicate", "unknown"]))
    if not len(w.tensors) or kind == "unknown":
        w.tensors.add(name="not.a.weight", dtype=1, shape=[1], data=b"\0\0\0\0")
        return "weights.unknown"
    i = draw(st.integers(0, len(w.tensors) - 1))
    if kind == "drop":
        del w.tensors[i]
        return "weights.drop"
    if kind == "duplicate":
        w.tensors.add().CopyFrom(w.tensors[i])
        return "weights.duplicate"
    return "weights." + _tensor_mutation(draw, w.tensors[i], vocab)


@st.composite
def mutated(draw, rpc: Rpc, seed, paths: list[str], vocab: int):
    """`seed` (a valid request of `rpc`) with one to three mutations."""
    msg = rpc.request_cls()
    msg.CopyFrom(seed)
    done = []
    for _ in range(draw(st.integers(1, 3))):
        options = [f for f in ("batch", "rows", "weights", "sampling", "path", "weights_version", "trunk_only",
                               "calculate_entropy", *SIZES, "group_id") if f in msg.DESCRIPTOR.fields_by_name]
        if not options:
            break
        field = draw(st.sampled_from(options))
        if field == "batch":
            done.append(_batch_mutation(draw, msg.batch, vocab))
        elif field == "rows" and msg.rows.HasField("batch") and draw(st.booleans()):
            done.append("rows." + _batch_mutation(draw, msg.rows.batch, vocab))
        elif field == "rows":  # the actor's kept rows: a key it does not hold, odd row numbers
            msg.rows.kept.key = draw(st.sampled_from(["", "unknown-1", "x" * 10_000]))
            msg.rows.kept.rows.extend(draw(st.lists(st.sampled_from([-1, 0, 3, 2**31, 2**63 - 1]), max_size=3)))
            done.append("rows.kept")
        elif field == "weights":
            done.append(_weights_mutation(draw, msg.weights, vocab))
        elif field == "sampling":
            done.append(_sampling_mutation(draw, msg.sampling))
        elif field == "path":
            msg.path = draw(st.sampled_from(paths))
            done.append(f"path {msg.path[-40:]!r}")
        elif field == "weights_version":
            msg.weights_version = draw(st.sampled_from([-1, -2**63, 2**63 - 1, (msg.weights_version + 1) % 2**62]))
            done.append("weights_version")
        elif field in SIZES:  # byte counts and ranges of the weight plane
            setattr(msg, field, draw(st.sampled_from([-1, 0, 1, 255, 2**31, 2**40, 2**63 - 1, -2**63])))
            done.append(field)
        elif field == "group_id":
            msg.group_id = draw(st.sampled_from(["", "unknown", "x" * 10_000, "\x00"]))
            done.append("group_id")
        else:
            setattr(msg, field, not getattr(msg, field))
            done.append(field)
    return Case(rpc, msg.SerializeToString(), "mutated: " + ", ".join(done))


@st.composite
def corrupted(draw, rpc: Rpc, seed):
    """A valid request's bytes, truncated / with flipped bytes / with junk appended."""
    data = bytearray(seed.SerializeToString())
    kind = draw(st.sampled_from(["truncate", "flip", "append"]))
    if kind == "truncate" and data:
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif kind == "flip" and data:
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    else:
        data += draw(st.binary(min_size=1, max_size=64))
    return Case(rpc, bytes(data), f"bytes {kind}")


def cases(seeds: dict[str, object], paths: list[str], vocab: int, only: str | None = None):
    """Cases for every RPC of `rpcs()` (`only`: for the one of that name): seeds maps Rpc.name -> a
    valid request of it."""
    per_rpc = []
    for rpc in (r for r in rpcs() if only in (None, r.name)):
        seed = seeds[rpc.name]
        per_rpc.append(st.one_of(from_descriptor(rpc), mutated(rpc, seed, paths, vocab),
                                 mutated(rpc, seed, paths, vocab), corrupted(rpc, seed)))
    return st.one_of(per_rpc)
