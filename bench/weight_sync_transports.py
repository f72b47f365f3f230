"""bench/weight_sync.py's transport part: its two processes, the loopback socket baseline, the table.

`source`: a model at a shape (its parameters are the export, as an actor at TP=1), served as
ActorService's weight RPCs by the library's own WeightSource / WeightSourceServicer.
`sink`: a model of the same shape behind the library's own WeightStaging / WeightReceiver (a
rollout of one rank), which syncs from the source by each transport `reps` times after a
warm-up and also measures, in the same process: the swap alone (staging -> parameters), the
colocated TP=1 copy (RolloutWorker.load_weights from TP=1 tensors on the same device: what the
colocated rollout's TP=1 copy does each generation) and one device copy of the model's bytes.
Every transport's result is checked against the source's per-tensor byte sums.

`run_transports` (called by bench/weight_sync.py) starts them as `python bench/weight_sync_transports.py
source|sink ...` with CUDA_VISIBLE_DEVICES choosing their GPUs, and prints the table.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

SHAPES = {  # Qwen2.5 shapes (GQA, qkv bias; tied embeddings up to 3B), and CPU ones (fp32)
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
    "14b": dict(hidden_size=5120, num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8,
                intermediate_size=13824, vocab_size=152064, tie_word_embeddings=False),
    "cpu-small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=1024, vocab_size=4096, tie_word_embeddings=True),
    "cpu-700mb": dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=8,
                      intermediate_size=4096, vocab_size=8192, tie_word_embeddings=True),
}


def build(name: str, seed: int):
    """(shape, model) on this process's device, torch.distributed + megatron set up for one rank."""
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape
    from tandem.parallel import device
    from tandem.parallel.layout import ParallelConfig, init_distributed

    init_distributed(ParallelConfig(), 0, 1, seed=seed)  # a group of one: no rendezvous
    shape = ModelShape(max_position_embeddings=4096, rope_theta=1e6, attention_bias=True, **SHAPES[name])
    dtype = torch.bfloat16 if device.has_cuda() else torch.float32
    return shape, build_gpt_model(shape, params_dtype=dtype).eval().requires_grad_(False)


def tp1_params(model, shape) -> dict[str, torch.Tensor]:
    from tandem.models.registry import weight_mappings

    params = dict(model.named_parameters())
    return {m.megatron: params[m.megatron].detach() for m in weight_mappings(shape)}


def byte_sums(tensors) -> list[int]:
    """Per tensor, the sum of its bytes (int64, in 64 MiB pieces): a cheap equality check."""
    from tandem.weights.layout import byte_view

    out = []
    for t in tensors:
        b = byte_view(t.contiguous())
        out.append(sum(int(b[i:i + (64 << 20)].sum(dtype=torch.int64)) for i in range(0, b.numel(), 64 << 20)))
    return out


def source(name: str, port_file: str, sums_file: str) -> None:
    from tandem.rpc.server import run_server, serve
    from tandem.serving.worker_thread import WorkerThread
    from tandem.weights.source import WeightSource
    from tandem.weights.source_servicer import WeightSourceServicer

    shape, model = build(name, seed=1)
    weights = tp1_params(model, shape)
    thread = WorkerThread("bench-source")
    servicer = WeightSourceServicer()
    servicer.weights = WeightSource(lambda: (1, 0, weights), thread.run, lambda: 0)
    # what each new version costs the source (GPU: a copy into its export buffer, stamps, word sum)
    snapshot_s = _timed(lambda: servicer.weights._snapshot_of(1, 0, weights), 3)
    with open(sums_file, "w") as f:
        json.dump({"sums": byte_sums(weights.values()), "snapshot_s": snapshot_s}, f)
    run_server(serve([("tandem.v1.ActorService", servicer)], role="bench-source", port_file=port_file))


def _timed(fn, reps: int) -> float:
    from tandem.parallel import device

    fn()
    device.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    device.synchronize()
    return (time.perf_counter() - t0) / reps


def sink(name: str, endpoint: str, transports: str, reps: int, chunk_mb: float, bucket_mb: int, streams: int,
         sums_file: str, out_file: str) -> None:
    from tandem.config import WeightSyncConfig
    from tandem.rollout.worker import RolloutWorker
    from tandem.serving.rank_group import RankGroup
    from tandem.serving.worker_thread import WorkerThread
    from tandem.weights import transport as T
    from tandem.weights.layout import views
    from tandem.weights.receiver import WeightReceiver
    from tandem.weights.staging import WeightStaging

    shape, model = build(name, seed=2)
    worker = RolloutWorker(model, pad_id=0, eos_id=1, vocab_size=shape.vocab_size, max_batch_size=1, weights_version=-1)
    staging = WeightStaging(model, shape, worker)
    group = RankGroup({"rollout": worker, "weights": staging})
    thread = WorkerThread("bench-sink")
    cfg = WeightSyncConfig(chunk_mb=chunk_mb, bucket_mb=bucket_mb, streams=streams)
    with open(sums_file) as f:
        source_info = json.load(f)
    want = source_info["sums"]
    out = {"bytes": staging.expected.total_bytes, "transports": {}, "snapshot_s": source_info["snapshot_s"]}

    async def run():
        receiver = WeightReceiver(group, staging, thread, cfg, "127.0.0.1")
        for kind in transports.split(","):
            first = await receiver.sync(1, endpoint, kind, True)  # warm-up: joins a group, opens handles
            seconds, transfer, sockets, phases = [], [], [], []
            for _ in range(reps):
                if kind == "stream":  # the loopback baselines right before each stream (shared, noisy hosts)
                    n = min(staging.expected.total_bytes, 1 << 30)
                    sockets.append((socket_gbps(n, reps=1), socket_gbps(n, reps=1, hot=True)))
                result = await receiver.sync(1, endpoint, kind, True)
                seconds.append(result.seconds)
                transfer.append(result.transfer_seconds)
                phases.append(dict(result.breakdown, opened=float(result.opened)))
            ok = byte_sums(tp1_params(model, shape).values()) == want
            out["transports"][kind] = {"seconds": seconds, "transfer": transfer, "socket_gbps": sockets, "verified": ok,
                                       "phases": phases, "first": dict(first.breakdown, seconds=first.seconds,
                                                                       opened=float(first.opened))}

    placements = [T.local_placement()]
    names = [t for t in transports.split(",") if t]
    from tandem.weights.client import WeightSourceClient

    async def source_placement():
        client = WeightSourceClient(endpoint, 60)
        _, placement = await client.manifest()
        await client.close()
        return placement
    src = asyncio.run(source_placement())
    skipped = {k: T.problem(k, src, placements) for k in names if T.problem(k, src, placements)}
    transports = ",".join(k for k in names if k not in skipped)
    asyncio.run(run())
    out["skipped"] = skipped
    full = dict(zip([s.name for s in staging.expected.tensors], views(staging.buffer, staging.expected)))
    out["commit_s"] = _timed(lambda: staging.commit(1, False), reps)
    out["colocated_s"] = _timed(lambda: worker.load_weights(full, 1), reps)
    n = min(staging.expected.total_bytes, 2 << 30)
    src_buf, dst_buf = staging.buffer[:n], torch.empty(n, dtype=torch.uint8, device=staging.buffer.device)
    out["copy_gbps"] = n / _timed(lambda: dst_buf.copy_(src_buf), reps) / 1e9  # bytes copied per second
    thread.shutdown()
    with open(out_file, "w") as f:
        json.dump(out, f)


def _socket_sender(port: int, total: int, size: int, hot: bool) -> None:
    n = size if hot else total
    data = memoryview(bytearray(os.urandom(1 << 20)) * -(-n >> 20))
    with socket.create_connection(("127.0.0.1", port)) as c:
        for a in range(0, total, size):
            c.sendall(data[a % n: a % n + min(size, total - a)])


def socket_gbps(total: int, size: int = 1 << 20, reps: int = 3, hot: bool = False) -> float:
    """A plain TCP transfer of `total` bytes between two processes over 127.0.0.1 (best of reps),
    in `size`-byte pieces: from a `total`-byte buffer into another (the data motion of a sync,
    without gRPC), or with `hot` the same `size` bytes again and again (the link's peak)."""
    import multiprocessing as mp

    import numpy as np

    buf = bytearray(size if hot else total)
    np.frombuffer(buf, dtype=np.uint8).fill(1)  # touched, as the staging buffer a sync writes into is
    best, out = 0.0, memoryview(buf)
    for _ in range(reps):
        with socket.socket() as srv:
            srv.bind(("127.0.0.1", 0))
            srv.listen(1)
            p = mp.get_context("spawn").Process(target=_socket_sender, args=(srv.getsockname()[1], total, size, hot))
            p.start()
            conn, _ = srv.accept()
            got, t0 = 0, time.perf_counter()
            while got < total:
                at = 0 if hot else got
                if (n := conn.recv_into(out[at: at + size], min(size, total - got))) <= 0:
                    break
                got += n
            best = max(best, got / (time.perf_counter() - t0) / 1e9)
            conn.close()
            p.join()
    return best


def _wait_for(path: str, proc, timeout_s: float = 600) -> str:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"source process ended or timed out (exit {proc.poll()})")
        time.sleep(0.2)
    with open(path) as f:
        return f.read().strip()


def _sinks(gpus: int) -> list[tuple[str, str | None, list[str]]]:
    """(label, CUDA_VISIBLE_DEVICES of the sink, the transports that fit there); the source is on GPU 0."""
    if not gpus:
        return [("host (CPU)", None, ["ipc", "stream", "collective"])]  # ipc on CPU: a shared-memory file
    out = [("same GPU", "0", ["ipc", "stream"])]
    if gpus > 1:
        out.append(("other GPU", "1", ["collective", "stream"]))
    return out


def measure(name: str, a) -> list[dict]:
    """Rows for one shape: every sink placement x transport."""
    import subprocess

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    here, tmp = os.path.abspath(__file__), tempfile.mkdtemp(prefix="tandem-wsync-")
    port_file, sums = os.path.join(tmp, "port"), os.path.join(tmp, "sums.json")
    env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": "0"} if gpus else {}))
    src = subprocess.Popen([sys.executable, here, "source", name, port_file, sums], env=env)
    rows = []
    try:
        endpoint = f"127.0.0.1:{int(_wait_for(port_file, src))}"
        for label, devices, fits in _sinks(gpus):
            kinds = [k for k in a.transports.split(",") if k in fits]
            if not kinds:
                continue
            out_file = os.path.join(tmp, f"sink-{label.replace(' ', '_')}.json")
            sink_env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": devices} if devices else {}))
            subprocess.run([sys.executable, here, "sink", name, endpoint, ",".join(kinds), str(a.reps),
                            str(a.chunk_mb), str(a.bucket_mb), str(a.streams), sums, out_file], env=sink_env, check=True)
            with open(out_file) as f:
                res = json.load(f)
            for kind, t in res["transports"].items():
                common = {k: v for k, v in res.items() if k not in ("transports", "skipped")}
                rows.append(dict(shape=name, sink=label, transport=kind, **common, **t))
            rows += [dict(shape=name, sink=label, transport=k, skipped=why) for k, why in res["skipped"].items()]
    finally:
        src.terminate()
        src.wait()
    return rows


PHASES = ("manifest", "rpc", "open", "copy", "check", "commit")


def run_transports(a) -> None:
    """Each shape in its own processes; its rows printed as soon as it is measured (a shape that
    fails is reported and the others still run); everything also written to --out/transports.json."""
    from tandem.parallel import device

    shapes = (a.shapes or ("0.5b,1.5b,7b,14b" if device.has_cuda() and not os.environ.get("TANDEM_BENCH_TINY")
                           else "cpu-small,cpu-700mb")).split(",")
    import megatron.core

    where = (f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}" if device.has_cuda()
             else f"CPU ({os.cpu_count()} cores)")
    print(f"\n- machine: {where}, torch {torch.__version__}, megatron-core {megatron.core.__version__}; "
          f"mean of {a.reps} syncs after a warm-up; {a.streams} streams of {a.chunk_mb:g} MiB chunks, collective "
          f"buckets {a.bucket_mb} MiB; transfer: moving the bytes into the staging buffer (the sync also reads the "
          "manifest, checks and swaps); transfer / loopback TCP: the median over the syncs of the stream's transfer "
          "GB/s over that of a plain TCP transfer of the same bytes (up to 1 GiB) from one buffer into another, and "
          "over that of 1 MiB sent again and again (hot in cache: the link's peak), both between two processes on "
          "127.0.0.1 and run just before each sync; source snapshot: what each new version costs the source before "
          "any replica syncs (GPU: one copy into its export buffer, its stamps and word sum; the syncs here repeat "
          "one version); ipc on CPU: the same protocol over a shared-memory file", flush=True)
    results, out = [], getattr(a, "out", None)
    for name in shapes:
        try:
            rows = measure(name, a)
        except Exception as e:  # noqa: BLE001 - one shape's failure must not lose the others
            print(f"\n{name}: FAILED: {e}", flush=True)
            results.append(dict(shape=name, failed=str(e)))
            continue
        results += rows
        print_rows(rows)
        if out:
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "transports.json"), "w") as f:
                json.dump(results, f, indent=1)


def print_rows(rows: list[dict]) -> None:
    print("\n| shape | sink | transport | model bytes | sync | sync GB/s | transfer GB/s | swap alone "
          "| source snapshot | colocated TP=1 copy | sync / colocated | (sync + snapshot) / colocated "
          "| one device copy of the bytes | sync / device copy | transfer / loopback TCP | checked |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['shape']} | {r['sink']} | {r['transport']} | | skipped: {r['skipped']} |" + " |" * 11)
            continue
        sync = sum(r["seconds"]) / len(r["seconds"])
        gbps, copy_s = r["bytes"] / sync / 1e9, r["bytes"] / (r["copy_gbps"] * 1e9)
        vs_socket = ""
        if r["socket_gbps"]:
            per = [[r["bytes"] / t / 1e9 / g[k] for t, g in zip(r["transfer"], r["socket_gbps"])] for k in (0, 1)]
            tcp = [statistics.median(g[k] for g in r["socket_gbps"]) for k in (0, 1)]
            vs_socket = (f"{statistics.median(per[0]):.2f} of {tcp[0]:.2f} GB/s; {statistics.median(per[1]):.2f} of "
                         f"{tcp[1]:.2f} GB/s hot")
        moving = r["bytes"] / statistics.mean(r["transfer"]) / 1e9
        print(f"| {r['shape']} | {r['sink']} | {r['transport']} | {r['bytes'] / 1e9:.3f} GB | {sync * 1e3:.1f} ms "
              f"| {gbps:.2f} | {moving:.2f} | {r['commit_s'] * 1e3:.1f} ms | {r['snapshot_s'] * 1e3:.1f} ms "
              f"| {r['colocated_s'] * 1e3:.1f} ms | {sync / r['colocated_s']:.2f} "
              f"| {(sync + r['snapshot_s']) / r['colocated_s']:.2f} | {copy_s * 1e3:.1f} ms | {sync / copy_s:.1f} "
              f"| {vs_socket} "
              f"| {'yes' if r['verified'] else 'NO'} |")
    ipc = [r for r in rows if r.get("transport") == "ipc" and "phases" in r]
    if not ipc:
        return
    print("\nipc sync, per phase (ms; mean over the timed syncs; first: the warm-up sync, which opens the handle "
          "and reads the manifest): manifest = GetWeightsManifest + transport choice (first sync only), rpc = "
          "ShareWeights, open = mapping the source's buffer, copy = into the staging buffer, check = the seqlock "
          "stamps + word sum of the copy, commit = staging -> parameters")
    print("\n| shape | sync | " + " | ".join(PHASES) + " | other | buffer opened | first sync | first: "
          + " | first: ".join(PHASES) + " | colocated TP=1 copy | sync / colocated |")
    print("| --- " * (5 + 2 * len(PHASES) + 3) + "|")
    for r in ipc:
        sync = statistics.mean(r["seconds"])
        mean = {k: statistics.mean(p.get(k, 0.0) for p in r["phases"]) for k in PHASES}
        first = r["first"]
        print(f"| {r['shape']} | {sync * 1e3:.2f} | " + " | ".join(f"{mean[k] * 1e3:.2f}" for k in PHASES)
              + f" | {(sync - sum(mean.values())) * 1e3:.2f} | {sum(p['opened'] for p in r['phases']):.0f} of "
              f"{len(r['phases'])} | {first['seconds'] * 1e3:.2f} | "
              + " | ".join(f"{first.get(k, 0.0) * 1e3:.2f}" for k in PHASES)
              + f" | {r['colocated_s'] * 1e3:.2f} | {sync / r['colocated_s']:.2f} |", flush=True)


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "source":
        source(*args)
    else:
        name, endpoint, transports, reps, chunk_mb, bucket_mb, streams, sums_file, out_file = args
        sink(name, endpoint, transports, int(reps), float(chunk_mb), int(bucket_mb), int(streams), sums_file, out_file)
