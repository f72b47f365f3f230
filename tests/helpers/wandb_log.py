"""Read back what an offline wandb run logged, from its transaction log (run-*.wandb).

wandb 0.31 ships no Python reader for these files (its sync and `beta leet` read them in the Go
core), so this unpacks the log's framing (LevelDB's log format: 32 KiB blocks of records with a
7-byte header, after wandb's 7-byte ":W&B" file header) and parses each record with wandb's own
protobuf message (wandb.proto.wandb_internal_pb2.Record).
"""
import glob
import json
import os
import struct

BLOCK = 32768
HEADER = 7  # crc32c (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str) -> list[bytes]:
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:7]
    out, pending, pos = [], b"", 7
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:  # the rest of the block is padding
            pos += left
            continue
        chunk, pos = data[pos + HEADER:pos + HEADER + length], pos + HEADER + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
    return out


def offline_run(run_dir: str) -> dict:
    """{"history": [{key: value} per wandb.log call], "config": {key: value}} of the one offline run
    under run_dir/wandb."""
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    history, config = [], {}
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        elif kind in ("run", "config"):  # the config given to wandb.init, later updates
            items = record.run.config.update if kind == "run" else record.config.update
            config.update({i.key: json.loads(i.value_json) for i in items})
    return {"history": history, "config": config}
