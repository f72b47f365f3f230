"""Codec round trips (every dtype, empty batches, scalars, columns, meta) and
decode-side validation messages, without a server."""

import pytest
import torch

from tandem.data import codec, validate
from tandem.data.batch import DataProto
from tandem.rpc.errors import InvalidArgument
from tandem.v1 import data_pb2

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]


def sample(dtype: torch.dtype, shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)


def wire(pb):
    """Through serialized bytes, as on the network."""
    return type(pb).FromString(pb.SerializeToString())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensor_round_trip_every_dtype(dtype):
    t = sample(dtype, (3, 5))
    name, back = codec.decode_tensor(wire(codec.encode_tensor("x", t)))
    assert name == "x" and back.dtype == dtype and back.shape == t.shape
    assert torch.equal(back, t)  # bit-exact, including bf16
    back[0, 0] = back[0, 1]  # decoded tensors are ours to write


def test_bytes_are_little_endian_c_order():
    t = torch.tensor([[1, 2], [3, 256]], dtype=torch.int16).t()  # non-contiguous
    pb = codec.encode_tensor("x", t)
    assert list(pb.shape) == [2, 2] and pb.dtype == data_pb2.DTYPE_INT16
    assert pb.data == bytes([1, 0, 3, 0, 2, 0, 0, 1])
    assert codec.encode_tensor("b", torch.tensor([1.0], dtype=torch.bfloat16)).data == b"\x80\x3f"


def test_batch_round_trip_columns_meta():
    b = DataProto(
        tensors={d: sample(getattr(torch, d), (4, 2)) for d in ("bfloat16", "bool", "int64", "float32")},
        columns={"response_text": ["a", "ß\n\"x\"", "", "d"],
                 "extra_info": [{"k": [1, 2]}, None, "str", 3.5]},
        meta={"temperature": 0.5, "n": 2, "nested": {"a": [1, "x", True]}})
    d = codec.decode_batch(wire(codec.encode_batch(b)))
    for k, t in b.tensors.items():
        assert torch.equal(d[k], t) and d[k].dtype == t.dtype
    assert d["response_text"] == b["response_text"]
    assert d["extra_info"] == b["extra_info"]
    pb = codec.encode_batch(b)
    assert [c.json for c in pb.columns] == [False, True]
    # Struct carries numbers as doubles: ints come back as floats (documented).
    assert d.meta == {"temperature": 0.5, "n": 2.0, "nested": {"a": [1.0, "x", True]}}
    assert isinstance(d.meta["n"], float)


def test_zero_row_batch_and_empty_batch():
    b = DataProto(tensors={"ids": torch.zeros(0, 7, dtype=torch.int64)}, columns={"t": []})
    d = codec.decode_batch(wire(codec.encode_batch(b)))
    assert len(d) == 0 and d["ids"].shape == (0, 7) and d["t"] == []
    e = codec.decode_batch(wire(codec.encode_batch(DataProto())))
    assert len(e) == 0 and e.tensors == {} and e.columns == {} and e.meta == {}


def test_named_tensors_scalars_and_shapes():
    w = {"scalar": torch.tensor(3.25), "bf": torch.randn(2, 3, 4).bfloat16(), "empty": torch.zeros(0, 5),
         "step": torch.tensor(7, dtype=torch.int64)}
    back = codec.decode_named(wire(codec.encode_named(w)))
    assert list(back) == list(w)
    for k in w:
        assert back[k].shape == w[k].shape and back[k].dtype == w[k].dtype and torch.equal(back[k], w[k])


def bad_tensor(**kw):
    args = dict(name="input_ids", dtype=data_pb2.DTYPE_INT64, shape=[2, 4], data=b"\0" * 64)
    args.update(kw)
    return data_pb2.Tensor(**args)


@pytest.mark.parametrize("tensor, message", [
    (bad_tensor(data=b"\0" * 24), r"tensor 'input_ids': 24 bytes do not match shape \[2, 4\] x int64 \(64 bytes\)"),
    (bad_tensor(dtype=42), r"tensor 'input_ids': unknown dtype enum value 42"),
    (bad_tensor(dtype=0), r"tensor 'input_ids': DTYPE_UNSPECIFIED"),
    (bad_tensor(shape=[-2, -4]), r"tensor 'input_ids': negative dimension"),
    (bad_tensor(name=""), r"empty name"),
    (bad_tensor(dtype=data_pb2.DTYPE_BOOL, shape=[2], data=b"\x01\x07"), r"tensor 'input_ids': bool bytes"),
])
def test_decode_rejects_bad_tensors(tensor, message):
    with pytest.raises(InvalidArgument, match=message):
        codec.decode_batch(data_pb2.Batch(tensors=[tensor]))


def test_decode_rejects_bad_batches():
    ok = bad_tensor()
    cases = [
        (data_pb2.Batch(tensors=[ok, ok]), r"duplicate tensor name 'input_ids'"),
        (data_pb2.Batch(tensors=[ok], columns=[data_pb2.Column(name="y", values=["a"])]),
         r"batch: tensor 'input_ids' has 2 rows but column 'y' has 1"),
        (data_pb2.Batch(columns=[data_pb2.Column(name="extra_info", values=["{}", "{oops"], json=True)]),
         r"column 'extra_info': row 1 is not valid JSON"),
        (data_pb2.Batch(tensors=[bad_tensor(shape=[], data=b"\0" * 8)]), r"tensor 'input_ids' is 0-dim"),
        (data_pb2.Batch(tensors=[ok], columns=[data_pb2.Column(name="input_ids", values=["a", "b"])]),
         r"duplicate name 'input_ids'"),
    ]
    nan_meta = data_pb2.Batch(tensors=[ok])
    nan_meta.meta.update({"temperature": float("nan")})  # found by the fuzzer: JSON has no NaN
    cases.append((nan_meta, r"meta: .*NaN"))
    for pb, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            codec.decode_batch(pb)
    with pytest.raises(InvalidArgument, match="duplicate name 'w'"):
        codec.decode_named(data_pb2.NamedTensors(tensors=[bad_tensor(name="w")] * 2))


def test_encode_rejects_unsendable():
    with pytest.raises(TypeError, match="complex64"):
        codec.encode_tensor("z", torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(TypeError, match="column 'obj'"):
        codec.encode_batch(DataProto(columns={"obj": [object()]}))
    with pytest.raises(ValueError, match="column 'b' has 1"):
        codec.encode_batch(DataProto(columns={"a": ["x", "y"], "b": ["x"]}))


def test_validate_helpers():
    b = DataProto(tensors={"input_ids": torch.tensor([[1, 70000]]), "attention_mask": torch.ones(1, 3)},
                  columns={"ground_truth": ["4"]})
    assert validate.require_tensor(b, "input_ids", dtype=torch.int64, ndim=2, shape=(None, 2)).shape == (1, 2)
    with pytest.raises(InvalidArgument, match=r"tensor 'input_ids': dtype int64, expected float32 or bfloat16"):
        validate.require_tensor(b, "input_ids", dtype=(torch.float32, torch.bfloat16))
    with pytest.raises(InvalidArgument, match=r"tensor 'input_ids': shape \[1, 2\], expected \[\*, 3\]"):
        validate.require_tensor(b, "input_ids", shape=(None, 3))
    with pytest.raises(InvalidArgument, match=r"missing tensor 'responses'"):
        validate.require_tensor(b, "responses")
    with pytest.raises(InvalidArgument, match=r"missing column 'response_text'"):
        validate.require_column(b, "response_text")
    assert validate.require_column(b, "ground_truth") == ["4"]
    with pytest.raises(InvalidArgument, match=r"tensor 'attention_mask': shape \[1, 3\] differs"):
        validate.check_same_shape(b, "input_ids", "attention_mask")
    with pytest.raises(InvalidArgument,
                       match=r"tensor 'input_ids': token id 70000 out of vocabulary \[0, 64\)"):
        validate.check_token_range(b, "input_ids", 64)
    validate.check_token_range(b, "input_ids", 70001)
    assert validate.check_rows(b) == 1
    with pytest.raises(InvalidArgument, match="0 rows, need at least 1"):
        validate.check_rows(DataProto())
