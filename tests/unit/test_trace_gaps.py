"""bench/trace_gaps.py's per-call view: kernel time by kind and GPU idle time by gap length."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import trace_gaps  # noqa: E402


def _ev(name, cat, ts, dur):
    return {"name": name, "cat": cat, "ts": ts, "dur": dur, "ph": "X"}


def test_per_call_kinds_and_gaps():
    events = [_ev("actor.log_probs", "user_annotation", 0, 10_000),
              _ev("nvjet_sm90_tst_192x192", "kernel", 0, 3_000),           # GEMM
              _ev("pytorch_flash::flash_fwd_kernel", "kernel", 3_020, 980),  # 20 us gap before it
              _ev("triton_poi_fused_add_0", "kernel", 4_500, 500),           # 500 us gap
              _ev("triton_red_fused_sum_1", "kernel", 7_000, 1_000),         # 2 ms gap
              _ev("elementwise_kernel", "kernel", 8_000, 1_000),
              _ev("aten::mm", "cpu_op", 0, 100)]                             # 1 ms idle at the end
    lines = trace_gaps.report(events, top=5)
    row = next(line for line in lines if line.startswith("  actor.log_probs at"))
    wall, busy, kinds, gaps = (part.strip() for part in row.split(":", 1)[1].split("|"))
    assert (wall, busy) == ("10.0", "6.5")
    assert kinds == "3.0 / 1.0 / 0.5 / 1.0 / 1.0"  # GEMM, attention, pointwise, reduction, other
    assert gaps == "0.0 / 0.5 / 3.0 (4)"  # 20 us; 500 us; 2 ms + 1 ms at the end


def test_kind_names():
    assert trace_gaps.kind("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>") == "GEMM"
    assert trace_gaps.kind("triton_per_fused__fused_rms_norm_0") == "triton reduction"
    assert trace_gaps.kind("Memcpy DtoD (Device -> Device)") == "other"
