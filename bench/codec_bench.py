"""Codec throughput: DataProto <-> tandem.v1 Batch, against a plain memory copy.

Measures, on a realistic PPO batch (rows x seq int64 input_ids, fp32
log-probs, bf16 values), the median time of:

  encode            encode_batch (DataProto -> message, in memory)
  encode+serialize  encode_batch(...).SerializeToString()   (what goes on the wire)
  decode            decode_batch (message -> DataProto, in memory)
  parse+decode      decode_batch(Batch.FromString(bytes))
  decode zero-copy  frombuffer views without the owning copy (the option the
                    codec rejects: read-only buffers), to show what that copy costs

and reports GB/s of tensor payload and the ratio to `torch.clone` of the same
tensors (and a `bytes` copy of a buffer of the same size) measured in the
same run. Prints a markdown section for bench/results/codec.md.

    python bench/codec_bench.py [--rows 256] [--seq 2048] [--repeats 21]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import sys
import time
import warnings

import google.protobuf
import grpc
import torch
from google.protobuf.internal import api_implementation

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tandem.data import codec  # noqa: E402
from tandem.data.batch import DataProto  # noqa: E402
from tandem.v1 import data_pb2  # noqa: E402


def median_s(fn, repeats: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def decode_zero_copy(pb: data_pb2.Batch) -> dict:
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "buffer is not writable"
        for t in pb.tensors:
            dtype = codec._FROM_PB[t.dtype]
            out[t.name] = torch.frombuffer(t.data, dtype=dtype).reshape(list(t.shape))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()
    torch.set_num_threads(1)

    g = torch.Generator().manual_seed(0)
    batch = DataProto(
        tensors={"input_ids": torch.randint(0, 151_000, (args.rows, args.seq), generator=g),
                 "old_log_probs": -torch.rand(args.rows, args.seq, generator=g),
                 "values": torch.randn(args.rows, args.seq, generator=g).bfloat16()},
        columns={"data_source": ["arith"] * args.rows},
        meta={"temperature": 1.0})
    nbytes = sum(t.numel() * t.element_size() for t in batch.tensors.values())
    pb = codec.encode_batch(batch)
    blob = pb.SerializeToString()
    buf = bytearray(nbytes)

    cases = {
        "torch.clone (baseline)": lambda: [t.clone() for t in batch.tensors.values()],
        "bytes copy": lambda: bytes(buf),
        "encode": lambda: codec.encode_batch(batch),
        "encode+serialize": lambda: codec.encode_batch(batch).SerializeToString(),
        "decode": lambda: codec.decode_batch(pb),
        "parse+decode": lambda: codec.decode_batch(data_pb2.Batch.FromString(blob)),
        "decode zero-copy (rejected)": lambda: decode_zero_copy(pb),
    }
    times = {name: median_s(fn, args.repeats) for name, fn in cases.items()}
    base = times["torch.clone (baseline)"]

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print("## codec\n")
    print(f"- date: {now}")
    print(f"- command: `python {shlex.join(['bench/codec_bench.py', *sys.argv[1:]])}`")
    print(f"- machine: {platform.machine()}, nproc {len(os.sched_getaffinity(0))}, "
          f"python {platform.python_version()}, torch {torch.__version__}, "
          f"protobuf {google.protobuf.__version__} ({api_implementation.Type()}), grpcio {grpc.__version__}, "
          f"torch threads 1")
    print(f"- batch: {args.rows} rows x {args.seq} tokens: input_ids int64, old_log_probs fp32, "
          f"values bf16, 1 string column; payload {nbytes / 2**20:.1f} MiB, "
          f"serialized {len(blob) / 2**20:.1f} MiB; median of {args.repeats}\n")
    print("| operation | median ms | GB/s | x clone time |")
    print("| --- | ---: | ---: | ---: |")
    for name, s in times.items():
        print(f"| {name} | {s * 1e3:.2f} | {nbytes / s / 1e9:.2f} | {s / base:.2f} |")
    print()


if __name__ == "__main__":
    main()
