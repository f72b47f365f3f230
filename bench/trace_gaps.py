"""Where a traced step's time goes: the longest idle gaps on the GPU and the top ops of a Chrome trace.

    python bench/trace_gaps.py RUN_DIR/profile/actor_rank0_step3.json [--top 15]

Reads a torch.profiler Chrome trace (the `profile` keys write one per role, rank and RL step:
tandem/serving/call_observer.py) and prints

- the step's span, the GPU's busy time (union of kernel and memcpy/memset intervals) and its share;
- the longest gaps between GPU activity, each with the call it falls in (`<target>.<method>`
  ranges, e.g. `actor.compute_log_prob`) and the host ops running across it: what the GPU waited for;
- the calls by wall time, and the top kernels and top host ops by total time;
- per call, its GPU kernel time by kind (GEMM, attention, Triton pointwise / reduction, other) and its GPU
  idle time by gap length: idle spread over many short gaps means the host cannot issue kernels as
  fast as the GPU runs them (host-bound); a few long gaps mean the GPU waits for something.

On a CPU trace (no device events) the gaps are between host ops at the top level instead.
Deliberately not here: taking the trace (the `profile` keys).
"""
from __future__ import annotations

import argparse
import collections
import json

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def load(path: str) -> list[dict]:
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def idle(busy: list[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float, float]]:
    """(length, start, end) of every gap in [t0, t1] between the merged busy intervals."""
    edges = [(t0, t0)] + busy + [(t1, t1)]
    return [(b[0] - a[1], a[1], b[0]) for a, b in zip(edges, edges[1:]) if b[0] > a[1]]


def covering(events: list[dict], t0: float, t1: float, limit: int = 3) -> list[str]:
    """Names of the events overlapping [t0, t1], longest overlap first."""
    overlap = [(min(e["ts"] + e["dur"], t1) - max(e["ts"], t0), e["name"]) for e in events
               if e["ts"] < t1 and e["ts"] + e["dur"] > t0]
    return [n for _, n in sorted(overlap, reverse=True)[:limit]]


KINDS = (("GEMM", ("gemm", "nvjet", "cutlass", "xmma", "cublas")), ("attention", ("flash", "fmha", "attention")),
         ("triton pointwise", ("triton_poi",)), ("triton reduction", ("triton_red", "triton_per")))
GAP_BINS = ((50.0, "<50us"), (1000.0, "<1ms"), (float("inf"), ">=1ms"))


def kind(name: str) -> str:
    low = name.lower()
    return next((k for k, keys in KINDS if any(w in low for w in keys)), "other")


def per_call(calls: list[dict], device: list[dict], span0: float = 0.0) -> list[str]:
    """Each call's kernel time by kind and its GPU idle time by gap length (device events only)."""
    heads = [k for k, _ in KINDS] + ["other"]
    lines = ["", "per call: wall ms | GPU busy ms | kernel ms by kind (" + ", ".join(heads)
             + ") | idle ms in gaps " + " / ".join(b for _, b in GAP_BINS) + " (count)"]
    for c in sorted(calls, key=lambda e: e["ts"]):
        t0, t1 = c["ts"], c["ts"] + c["dur"]
        inside = [e for e in device if t0 <= e["ts"] < t1]
        by_kind = collections.Counter()
        for e in inside:
            by_kind[kind(e["name"])] += e["dur"]
        busy = union([(e["ts"], min(e["ts"] + e["dur"], t1)) for e in inside])
        gaps = idle(busy, t0, t1)
        by_bin = collections.Counter()
        for gap, _, _ in gaps:
            by_bin[next(label for bound, label in GAP_BINS if gap < bound)] += gap
        lines.append(f"  {c['name']} at +{(t0 - span0) / 1e3:.1f} ms: {c['dur'] / 1e3:.1f} | {sum(b - a for a, b in busy) / 1e3:.1f} | "
                     + " / ".join(f"{by_kind[k] / 1e3:.1f}" for k in heads) + " | "
                     + " / ".join(f"{by_bin[label] / 1e3:.1f}" for _, label in GAP_BINS) + f" ({len(gaps)})")
    return lines


def report(events: list[dict], top: int) -> list[str]:
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    calls = [e for e in events if e.get("cat") == "user_annotation"]
    host = [e for e in events if e.get("cat") == "cpu_op"]
    busy_src = device or host
    span0 = min(e["ts"] for e in events)
    span1 = max(e["ts"] + e["dur"] for e in events)
    busy = union([(e["ts"], e["ts"] + e["dur"]) for e in busy_src])
    busy_us = sum(b - a for a, b in busy)
    what = "GPU" if device else "host ops (no device events: a CPU trace)"
    lines = [f"span {(span1 - span0) / 1e3:.1f} ms; {what} busy {busy_us / 1e3:.1f} ms "
             f"({busy_us / max(span1 - span0, 1):.0%})", "", f"longest gaps of {what}:"]
    gaps = sorted(idle(busy, span0, span1), reverse=True)
    for dur, g0, g1 in gaps[:top]:
        lines.append(f"  {dur / 1e3:9.2f} ms at +{(g0 - span0) / 1e3:.1f} ms  in {covering(calls, g0, g1, 1) or ['-']}"
                     f"  host: {covering(host, g0, g1)}")
    lines += ["", "calls (wall ms):"]
    for e in sorted(calls, key=lambda e: -e["dur"])[:top]:
        lines.append(f"  {e['dur'] / 1e3:9.2f}  {e['name']} at +{(e['ts'] - span0) / 1e3:.1f} ms")
    for title, group in (("top kernels (total ms, count)", device), ("top host ops (total ms, count)", host)):
        totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
        for e in group:
            totals[e["name"]][0] += e["dur"]
            totals[e["name"]][1] += 1
        lines += ["", title + ":"]
        for name, (us, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
            lines.append(f"  {us / 1e3:9.2f} {n:6d}  {name[:110]}")
    if device:
        lines += per_call(calls, device, span0)
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=15)
    a = p.parse_args(argv)
    print("\n".join(report(load(a.trace), a.top)))


if __name__ == "__main__":
    main()
