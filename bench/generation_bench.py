"""Decode throughput of the generation engine against HF `generate` and the bandwidth bound.

For Qwen2.5-0.5B- and 1.5B-shaped megatron-core models (random bf16 weights) at each
batch size: 512-token prompts, 512 new tokens (EOS ignored), sampling at T = 1.
Printed per case:
  engine decode tok/s   B * (R - 1) / (time of generate - time of a prefill-only generate)
  HF generate tok/s     the same weights exported to a Qwen2ForCausalLM, B * R_hf / time
  bound tok/s           B / (bytes read per decode step / device copy rate), where bytes =
                        all weights once (tied embedding counted once, as the output layer)
                        + K and V of the current contexts (mean over the decode); the copy
                        rate is (bytes read + written) / s of a large device-to-device copy
                        measured in the same run.
`--decode modules,fused` (the default) runs each decode path in the same process, before
and after: `modules` is the megatron modules step, `fused` the fused_step.py functions
compiled with torch.compile (the GPU default), `fused-eager` the same uncompiled;
`--attn` the decode attention: `triton` (decode_attention.py, the GPU default), `sdpa`,
`matmul`; `fused-plain` / `fused-step` / `fused-autotune` the fused path in one compile
mode (fused_step.MODES); `--runs decode:attn,...` gives pairs instead of `--decode` x `--attn`, e.g.
`--runs fused:sdpa,fused:triton` (before and after the Triton kernel). `attn_used` is the
attention the runner ran (it falls back to sdpa where the kernel cannot run). `first_run_s`
includes compilation (unless an earlier run of that batch size compiled) and graph capture.
`--check` first verifies on the device: greedy output equals full recompute (fp32, CUDA
graphs on, refill on; each decode path) and sampled first-token frequencies match the
filtered softmax (the default path).

    python bench/generation_bench.py [--check] [--shapes 0.5b,1.5b] [--batches 64,256]
    python bench/generation_bench.py --tiny     # a seconds-long CPU smoke run
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tandem.models.spec import ModelShape  # noqa: E402
from tandem.parallel import device  # noqa: E402

SHAPES = {
    # Qwen2.5-0.5B / 1.5B config.json
    "0.5b": ModelShape(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, intermediate_size=4864, max_position_embeddings=2048,
                       rope_theta=1e6, attention_bias=True, tie_word_embeddings=True),
    "1.5b": ModelShape(vocab_size=151936, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2, intermediate_size=8960, max_position_embeddings=2048,
                       rope_theta=1e6, attention_bias=True, tie_word_embeddings=True),
    "tiny": ModelShape(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                       attention_bias=True, tie_word_embeddings=True),
}
OUT = os.environ.get("OUT", ".")


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)
    with open(os.path.join(OUT, "generation_bench.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def timed(fn) -> float:
    device.synchronize()
    t0 = time.perf_counter()
    fn()
    device.synchronize()
    return time.perf_counter() - t0


def copy_rate() -> float:
    """(bytes read + bytes written) / s of a 2 GiB device-to-device copy."""
    n = (1 << 30) if device.has_cuda() else (1 << 24)
    a = torch.empty(n, dtype=torch.bfloat16, device=device.device())
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    reps = 20
    t = timed(lambda: [b.copy_(a) for _ in range(reps)])
    return 2 * a.numel() * a.element_size() * reps / t


def bytes_per_step(model, shape: ModelShape, batch: int, context: float) -> float:
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if not shape.tie_word_embeddings:  # the input embedding reads only `batch` rows
        weights -= model.embedding.word_embeddings.weight.numel() * 2
    head_dim = shape.hidden_size // shape.num_attention_heads
    kv_per_token = shape.num_hidden_layers * 2 * shape.num_key_value_heads * head_dim * 2  # bf16
    return weights + batch * context * kv_per_token


def build(shape, dtype):
    from tandem.models.build import build_gpt_model

    torch.manual_seed(0)
    return build_gpt_model(shape, params_dtype=dtype).eval()


def decode_kw(decode: str) -> dict:
    """GenerationEngine arguments of a decode path name: modules, fused (the default compile
    mode), fused-eager, or fused-<mode> for a fused_step.MODES name (fused-plain, ...)."""
    from tandem.generation.fused_step import MODES

    modes = {"fused": True, "fused-eager": False, **{f"fused-{m}": m for m in MODES}}
    if decode != "modules" and decode not in modes:
        raise ValueError(f"decode must be modules or one of {sorted(modes)}, got {decode!r}")
    return dict(fused_decode=decode != "modules", compile_decode=modes.get(decode, False))


def check(runs, dtype=torch.float32, long_vocab=True) -> None:
    """Greedy == full recompute (each decode path and attention) and the sampled
    distribution (the default path), on this device."""
    from tandem.generation.engine import GenerationEngine
    from tandem.generation.sampling import SamplingParams, filter_logits
    from tandem.models.forward import forward_logits

    shape = ModelShape(vocab_size=64, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=256, max_position_embeddings=128,
                       init_std=0.3)
    model = build(shape, dtype)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 64, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g).tolist()
               for _ in range(12)]
    for decode, attn in runs:
        greedy_check(model, prompts, decode, attn)
    if long_vocab:
        long_vocab_check(20000 if device.has_cuda() else 1000)  # 12 GB of fp32 logits at 20000
    # sampled first-token frequencies vs the filtered softmax, T = 0.7, top-k 6, top-p 0.9
    n, temperature, top_k, top_p = 20000, 0.7, 6, 0.9
    prompt = prompts[0]
    with torch.no_grad():
        ids = torch.tensor([prompt], device=device.device())
        logits = forward_logits(model, ids, torch.ones_like(ids))[0, -1].float().cpu()
    expected = torch.softmax(filter_logits(logits[None] / temperature, top_k, top_p), -1)[0]
    keep = (expected > 0).nonzero().squeeze(-1).tolist()
    eng = GenerationEngine(model, pad_id=0, eos_id=1, vocab_size=64, max_batch_size=n)
    res = eng.generate([prompt], SamplingParams(max_new_tokens=2, temperature=temperature, top_k=top_k,
                                                top_p=top_p, n=n, seed=5))
    counts = torch.bincount(res.responses[:, 0], minlength=64)
    stat = sum((float(counts[i]) - n * float(expected[i])) ** 2 / (n * float(expected[i])) for i in keep)
    crit = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}[len(keep) - 1]
    emit({"check": "chi2_first_token", "fused": eng.runner.weights is not None,
          "attn_used": eng.runner.decode_attention, "kept_tokens": len(keep),
          "chi2": stat, "crit_0.001": crit, "outside_filter": int(counts.sum() - counts[keep].sum()),
          "ok": bool(stat < crit and int(counts[keep].sum()) == n)})


def long_vocab_check(draws: int = 20000) -> None:
    """The unfiltered sampler at Qwen's vocabulary (two-level draw over 75 blocks), compiled
    as the fused step compiles it: frequencies of 5 hot tokens in different blocks (one in
    the partial last block) of bf16 logits against their softmax."""
    from tandem.generation.sampling import sample_tokens

    v, hot = 151936, [5, 3001, 70000, 151000, 151935]
    row = torch.full((v,), -40.0)
    row[hot] = torch.tensor([0.1, 0.3, 0.2, 0.25, 0.15]).log()
    logits = row.to(device.device(), torch.bfloat16).expand(draws, -1)
    expected = torch.softmax(logits[0].float(), -1)[hot].cpu()
    fn = torch.compile(sample_tokens, fullgraph=True, dynamic=False) if device.has_cuda() else sample_tokens
    rows = torch.arange(draws, device=device.device())
    tokens, logp = fn(logits, False, 1.0, 0, 1.0, torch.tensor(7, device=device.device()), rows, torch.zeros_like(rows))
    counts = torch.bincount(tokens.cpu(), minlength=v)[hot].float()
    stat = float(((counts - draws * expected) ** 2 / (draws * expected)).sum())
    lp_err = float((logp.cpu() - expected.log()[torch.searchsorted(torch.tensor(hot), tokens.cpu())]).abs().max())
    emit({"check": "chi2_long_vocab_compiled", "vocab": v, "draws": draws, "chi2": stat, "crit_0.001": 18.467,
          "outside_hot": int(draws - counts.sum()), "max_logprob_err": lp_err,
          "ok": bool(stat < 18.467 and counts.sum() == draws and lp_err < 1e-3)})


def greedy_check(model, prompts, decode, attn) -> None:
    from tandem.generation.engine import GenerationEngine
    from tandem.generation.sampling import SamplingParams
    from tandem.models.forward import forward_logits

    eng = GenerationEngine(model, pad_id=0, eos_id=1, vocab_size=64, max_batch_size=5, decode_attention=attn,
                           **decode_kw(decode))
    res = eng.generate(prompts, SamplingParams(max_new_tokens=24, greedy=True))  # 5 slots: refill
    mismatches, max_lp = 0, 0.0
    with torch.no_grad():
        for i, p in enumerate(prompts):
            seq = list(p)
            for t in range(int(res.response_mask[i].sum())):
                ids = torch.tensor([seq], device=device.device())
                logits = forward_logits(model, ids, torch.ones_like(ids))[0, -1].float()
                tok = int(logits.argmax())
                mismatches += tok != int(res.responses[i, t])
                max_lp = max(max_lp, abs(float(torch.log_softmax(logits, -1)[tok]) - float(res.rollout_log_probs[i, t])))
                seq.append(tok)
    emit({"check": "greedy_vs_full_recompute", "decode": decode, "attn": attn,
          "attn_used": eng.runner.decode_attention, "fused": eng.runner.weights is not None,
          "rows": len(prompts), "graphs": len(eng.runner.graphs or []), "tokens": int(res.response_mask.sum()),
          "mismatches": mismatches, "max_logprob_diff": max_lp, "ok": mismatches == 0 and max_lp < 1e-4})


def profile(model, shape, batch, prompt_len, attn, kv_len, decode) -> None:
    """Kernel times of eager decode steps, and the step time of eager vs graph replay."""
    from tandem.generation.engine import GenerationEngine
    from tandem.generation.sampling import SamplingParams

    prompts = torch.randint(0, shape.vocab_size, (batch, prompt_len)).tolist()
    eng = GenerationEngine(model, pad_id=0, eos_id=-1, vocab_size=shape.vocab_size, max_batch_size=batch,
                           decode_attention=attn, **decode_kw(decode))
    # the first call compiles (fused) and captures the graphs of this batch size
    setup = timed(lambda: eng.generate(prompts, SamplingParams(max_new_tokens=kv_len - prompt_len, seed=1)))
    r = eng.runner

    def step():  # the window index restarts each step: the window buffers never overflow
        r.win_j.zero_()
        r._decode_step(batch, kv_len)
    with torch.no_grad():
        for _ in range(3):
            step()
        eager = timed(lambda: [step() for _ in range(20)]) / 20
        key = ("profile", batch, kv_len)
        state = [r.tok, r.pos, r.step, r.alive, r.win_j]
        r.graphs.replay(key, step, state)
        graph = timed(lambda: [r.graphs.replay(key, step, state) for _ in range(50)]) / 50
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            device.synchronize()
    emit({"profile": shape.hidden_size, "decode": decode, "batch": batch, "attn": attn,
          "attn_used": r.decode_attention, "kv_len": kv_len,
          "first_generate_s": setup, "eager_step_ms": eager * 1e3, "graph_step_ms": graph * 1e3})
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=18,
                                    max_name_column_width=70), flush=True)
    del eng, r

    def make_engine(sync_every):
        return GenerationEngine(model, pad_id=0, eos_id=-1, vocab_size=shape.vocab_size, max_batch_size=batch,
                                sync_every=sync_every, decode_attention=attn, **decode_kw(decode))
    for sync_every in (8, 16, 64):
        emit({"breakdown": shape.hidden_size, "batch": batch,
              **engine_breakdown(make_engine, prompts, kv_len - prompt_len, sync_every)})


def engine_breakdown(make_engine, prompts, new_tokens, sync_every) -> dict:
    """Where a whole generate's time goes: GPU time of the prefills and of the decode windows
    (CUDA events around each, so in-window device time per step is comparable with a
    back-to-back graph replay), host time in the scheduler, and the rest of the wall time
    (host work between windows that the device waits for)."""
    from tandem.generation.sampling import SamplingParams
    from tandem.generation.scheduler import Scheduler

    marks, host = {"prefill": [], "window": []}, {"schedule": 0.0, "update": 0.0}

    def timed_method(obj, name, kind):
        orig = getattr(obj, name)

        def run(*a):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = orig(*a)
            end.record()
            marks[kind].append((start, end, a[0].decode_steps if kind == "window" else 0))
            return out
        setattr(obj, name, run)

    def host_timed(name):
        orig = getattr(Scheduler, name)

        def run(self, *a):
            t0 = time.perf_counter()
            out = orig(self, *a)
            host[name] += time.perf_counter() - t0
            return out
        return orig, run

    eng = make_engine(sync_every)
    params = SamplingParams(max_new_tokens=new_tokens, seed=1)
    eng.generate(prompts, params)  # captures this engine's graphs
    r = eng.runner
    timed_method(r, "_prefill", "prefill")
    timed_method(r, "_decode_window", "window")
    saved = {n: host_timed(n) for n in host}
    for n, (_, run) in saved.items():
        setattr(Scheduler, n, run)
    try:
        wall = timed(lambda: eng.generate(prompts, params))
    finally:
        for n, (orig, _) in saved.items():
            setattr(Scheduler, n, orig)
        del r._prefill, r._decode_window
    gpu = {k: sum(s.elapsed_time(e) for s, e, _ in v) for k, v in marks.items()}
    steps = sum(n for _, _, n in marks["window"])
    return {"sync_every": sync_every, "wall_ms": wall * 1e3, "prefill_gpu_ms": gpu["prefill"],
            "windows": len(marks["window"]), "decode_steps": steps, "windows_gpu_ms": gpu["window"],
            "window_ms_per_step": gpu["window"] / steps, "scheduler_host_ms": 1e3 * sum(host.values()),
            "outside_ms": wall * 1e3 - gpu["prefill"] - gpu["window"],
            "outside_ms_per_step": (wall * 1e3 - gpu["prefill"] - gpu["window"]) / steps}


def bench_engine(model, shape, batch, prompt_len, new_tokens, rate, sync_every, attn="sdpa", decode="fused"):
    from tandem.generation.engine import GenerationEngine
    from tandem.generation.sampling import SamplingParams

    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, shape.vocab_size, (batch, prompt_len), generator=g).tolist()
    eng = GenerationEngine(model, pad_id=0, eos_id=-1, vocab_size=shape.vocab_size,
                           max_batch_size=batch, sync_every=sync_every, decode_attention=attn,
                           **decode_kw(decode))
    full = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=1)
    prefill = SamplingParams(max_new_tokens=1, temperature=1.0, seed=1)
    t_warm = timed(lambda: eng.generate(prompts, full))  # includes graph capture
    t_prefill = min(timed(lambda: eng.generate(prompts, prefill)) for _ in range(2))
    t_full = timed(lambda: eng.generate(prompts, full))
    decode_tps = batch * (new_tokens - 1) / (t_full - t_prefill)
    context = prompt_len + new_tokens / 2  # mean attended length over the decode
    step_bytes = bytes_per_step(model, shape, batch, context)
    bound_tps = batch / (step_bytes / rate)
    return {"decode": decode, "fused": eng.runner.weights is not None, "attn": attn,
            "attn_used": eng.runner.decode_attention,
            "engine_decode_tok_s": decode_tps, "engine_e2e_tok_s": batch * new_tokens / t_full,
            "prefill_s": t_prefill, "generate_s": t_full, "first_run_s": t_warm,
            "compile_and_capture_s": t_warm - t_full,
            "graphs": len(eng.runner.graphs or []), "bytes_per_step_GB": step_bytes / 1e9,
            "bound_tok_s": bound_tps, "fraction_of_bound": decode_tps / bound_tps,
            "step_ms": 1e3 * (t_full - t_prefill) / (new_tokens - 1)}


def bench_hf(model, shape, batches, prompt_len, hf_new):
    from transformers import AutoModelForCausalLM

    from tandem.convert.hf_export import export_hf

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        export_hf(model, shape, tmp, "Qwen2ForCausalLM")
        hf = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16).to(device.device()).eval()
    for batch in batches:
        g = torch.Generator().manual_seed(batch)
        ids = torch.randint(0, shape.vocab_size, (batch, prompt_len), generator=g).to(device.device())
        kw = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                  pad_token_id=0, eos_token_id=None)
        with torch.no_grad():
            hf.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
            t = timed(lambda: hf.generate(ids, max_new_tokens=hf_new, min_new_tokens=hf_new, **kw))
        out[batch] = batch * hf_new / t
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="0.5b,1.5b")
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=512)
    ap.add_argument("--hf-new", type=int, default=128, help="new tokens for HF generate (it is slow)")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--sync-every", type=int, default=16)
    ap.add_argument("--attn", default="triton", help="decode attention variants to run: triton,sdpa,matmul")
    ap.add_argument("--decode", default="modules,fused", help="decode paths to run: modules,fused,fused-eager")
    ap.add_argument("--runs", default=None, help="decode:attn pairs instead of --decode x --attn, "
                    "e.g. modules:sdpa,fused:sdpa,fused:triton")
    ap.add_argument("--check-runs", default=None, help="decode:attn pairs --check verifies (default: the runs)")
    ap.add_argument("--check-last", action="store_true", help="--check after the benchmark instead of before")
    ap.add_argument("--cases", default=None, help="shape:batch list in run order instead of --shapes x --batches, "
                    "e.g. 0.5b:256,1.5b:256,0.5b:64")
    ap.add_argument("--no-long-vocab", action="store_true", help="--check without the 152k-vocabulary sampler check")
    ap.add_argument("--profile", action="store_true", help="kernel table of decode steps (the last run)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run")
    args = ap.parse_args()
    if args.tiny:
        args.shapes, args.batches, args.prompt, args.new, args.hf_new = "tiny", "4,8", 16, 16, 8

    from tandem.parallel.layout import ParallelConfig, init_distributed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_distributed(ParallelConfig(), 0, 1, f"tcp://127.0.0.1:{port}", seed=1)
    name = torch.cuda.get_device_name() if device.has_cuda() else "cpu"
    rate = copy_rate()
    emit({"device": name, "torch": torch.__version__, "copy_rate_GBps": rate / 1e9})
    runs = [tuple(r.split(":")) for r in args.runs.split(",")] if args.runs else \
        [(d, a) for a in args.attn.split(",") for d in args.decode.split(",")]
    check_runs = [tuple(r.split(":")) for r in args.check_runs.split(",")] if args.check_runs else runs
    if args.check and not args.check_last:
        check(check_runs, long_vocab=not args.no_long_vocab)
    dtype = torch.bfloat16 if device.has_cuda() else torch.float32
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")] if args.cases else \
        [(s, int(b)) for s in args.shapes.split(",") for b in args.batches.split(",")]
    for shape_name, group in itertools.groupby(cases, key=lambda c: c[0]):
        shape, batches = SHAPES[shape_name], [b for _, b in group]
        model = build(shape, dtype)
        if args.profile and device.has_cuda():
            decode, attn = runs[-1]
            profile(model, shape, batches[-1], args.prompt, attn, args.prompt + args.new // 2, decode)
        hf = {} if args.no_hf else bench_hf(model, shape, batches, args.prompt, args.hf_new)
        for batch in batches:
            for decode, attn in runs:
                rec = {"shape": shape_name, "batch": batch, "prompt": args.prompt, "new": args.new,
                       **bench_engine(model, shape, batch, args.prompt, args.new, rate, args.sync_every, attn,
                                      decode)}
                if batch in hf:
                    rec["hf_generate_tok_s"] = hf[batch]
                    rec["hf_new_tokens"] = args.hf_new
                    rec["speedup_vs_hf"] = rec["engine_decode_tok_s"] / hf[batch]
                emit(rec)
        del model
        if device.has_cuda():
            torch.cuda.empty_cache()
    if args.check and args.check_last:
        check(check_runs, long_vocab=not args.no_long_vocab)


if __name__ == "__main__":
    main()
