"""Expert parallelism runs every data-parallel rank in lockstep (each MoE layer's all-to-all
spans them): the front door refuses a batch whose DP shards would run different numbers of
micro-batches, naming the numbers, instead of hanging (tandem/serving/dispatch.py)."""
import pytest
import torch

from tandem.data.batch import DataProto
from tandem.rpc.errors import InvalidArgument
from tandem.serving.dispatch import check_lockstep, layout


def rows(n: int) -> DataProto:
    return DataProto(tensors={"input_ids": torch.zeros(n, 3, dtype=torch.long)})


def test_uneven_micro_batch_counts_are_refused():
    lay = layout(rows(5), 5, 2)  # one mini-batch: 3 + 2 rows
    check_lockstep(lay, 4)  # 1 micro-batch on each rank
    with pytest.raises(InvalidArgument, match=r"mini-batch 0 splits into \[3, 2\] rows = \[2, 1\] micro-batches "
                                              r"of up to 2 rows over 2 data-parallel ranks"):
        check_lockstep(lay, 2)
    check_lockstep(layout(rows(8), 4, 2), 1)  # 2 mini-batches of 2 + 2 rows
    with pytest.raises(InvalidArgument, match=r"mini-batch 1 splits into \[1, 0\] rows"):
        check_lockstep(layout(rows(5), 4, 2), 1)  # the last mini-batch has one row for two ranks
