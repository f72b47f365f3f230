"""DataProto operations, including the edge cases (empty, padding, conflicts)."""

import pytest
import torch

from tandem.data.batch import DataProto


def make(rows: int = 5) -> DataProto:
    return DataProto(
        tensors={"ids": torch.arange(rows * 3).reshape(rows, 3),
                 "mask": torch.arange(rows) % 2 == 0},
        columns={"text": [f"t{i}" for i in range(rows)], "info": [{"i": i} for i in range(rows)]},
        meta={"temperature": 0.7},
    )


def rows_of(b: DataProto) -> list[int]:
    """Original row numbers, read back from column 'text'."""
    return [int(s[1:]) for s in b["text"]]


def test_len_and_getitem():
    b = make(5)
    assert len(b) == 5 and len(DataProto()) == 0
    assert b["ids"].shape == (5, 3) and b["text"][2] == "t2"
    assert "mask" in b and "nope" not in b
    with pytest.raises(KeyError, match="nope"):
        b["nope"]


def test_check_names_offending_key():
    b = make(3)
    b.check()
    b.columns["bad"] = ["a", "b"]
    with pytest.raises(ValueError, match=r"column 'bad' has 2"):
        b.check()
    with pytest.raises(ValueError, match=r"tensor 's' is 0-dim"):
        DataProto(tensors={"s": torch.tensor(1.0)}).check()


def test_select_slice_index():
    b = make(5)
    s = b.select(["ids"], [])
    assert list(s.tensors) == ["ids"] and s.columns == {} and s.meta == b.meta
    with pytest.raises(KeyError):
        b.select(["missing"])
    sl = b.slice(1, 3)
    assert rows_of(sl) == [1, 2] and torch.equal(sl["ids"], b["ids"][1:3])
    ix = b.index(torch.tensor([4, 0, 4]))
    assert rows_of(ix) == [4, 0, 4] and torch.equal(ix["ids"][0], b["ids"][4])
    assert rows_of(b.index([2])) == [2]
    with pytest.raises(IndexError):
        b.index([5])
    with pytest.raises(IndexError):
        b.index([-1])


def test_concat_split_chunk():
    b = make(7)
    parts = b.split(3)
    assert [len(p) for p in parts] == [3, 3, 1]
    back = DataProto.concat(parts)
    assert rows_of(back) == list(range(7)) and torch.equal(back["ids"], b["ids"])
    assert back.meta == {"temperature": 0.7}
    assert [len(p) for p in b.chunk(3)] == [3, 2, 2]
    assert rows_of(DataProto.concat(b.chunk(3))) == list(range(7))
    with pytest.raises(ValueError, match="non-empty"):
        make(2).chunk(3)
    with pytest.raises(ValueError, match="part 1"):
        DataProto.concat([make(2), make(2).select(["ids"])])
    assert make(0).split(4) == []


def test_repeat_interleave_order():
    b = make(3)
    r = b.repeat(2, interleave=True)
    assert rows_of(r) == [0, 0, 1, 1, 2, 2]
    assert r["ids"][:, 0].tolist() == [0, 0, 3, 3, 6, 6]
    r2 = b.repeat(2, interleave=False)
    assert rows_of(r2) == [0, 1, 2, 0, 1, 2]
    assert r2["ids"][:, 0].tolist() == [0, 3, 6, 0, 3, 6]
    assert r2["mask"].tolist() == [True, False, True] * 2


def test_pad_unpad_round_trip():
    b = make(5)
    p, pad = b.pad_to_multiple(4)
    assert pad == 3 and len(p) == 8 and rows_of(p) == [0, 1, 2, 3, 4, 0, 1, 2]
    u = p.unpad(pad)
    assert rows_of(u) == list(range(5)) and torch.equal(u["ids"], b["ids"])
    # more padding than rows: cycles through the rows
    p2, pad2 = make(2).pad_to_multiple(7)
    assert pad2 == 5 and rows_of(p2) == [0, 1, 0, 1, 0, 1, 0]
    p3, pad3 = b.pad_to_multiple(5)
    assert pad3 == 0 and len(p3) == 5
    assert make(0).pad_to_multiple(4)[1] == 0


def test_union_adds_keys_and_rejects_conflicts():
    b = make(3)
    other = DataProto(tensors={"ids": b["ids"].clone(), "values": torch.zeros(3, 3)},
                      columns={"score": [1, 2, 3]}, meta={"step": 4})
    u = b.union(other)
    assert set(u.tensors) == {"ids", "mask", "values"} and u["score"] == [1, 2, 3]
    assert u.meta == {"temperature": 0.7, "step": 4}
    assert "values" not in b.tensors  # not in place
    bad = DataProto(tensors={"ids": b["ids"] + 1})
    with pytest.raises(ValueError, match="tensor 'ids' differs"):
        b.union(bad)
    with pytest.raises(ValueError, match="column 'text' differs"):
        b.union(DataProto(columns={"text": ["x", "y", "z"]}))
    with pytest.raises(ValueError, match="3 rows vs 2 rows"):
        b.union(make(2))
    assert len(DataProto().union(b)) == 3


def test_empty_batch_ops():
    e = make(0)
    assert len(e) == 0
    e.check()
    assert len(e.repeat(3)) == 0
    assert len(DataProto.concat([e, make(2)])) == 2
    assert len(e.to("cpu")) == 0 and e.to("cpu")["ids"].shape == (0, 3)
