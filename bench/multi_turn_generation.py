"""Generation throughput in multi-turn mode against single-turn at the same total tokens (issue 50).

One random-init megatron-core model of a Qwen2.5 shape (bf16 on CUDA, fp32 on CPU), the real
GenerationEngine with its defaults, prompts of random tokens, T = 1, EOS disabled: every row is
exactly --new response tokens long in both modes. Per repeat, in one process:
  single-turn   the rows generate --new model tokens (the baseline)
  multi-turn    the same rows with tools (multi_turn.MultiTurn): a row that samples X pauses, its call
                is answered in process after --latency-ms, --obs observation tokens (random vocabulary
                ids) are fed into its KV cache and it goes on: model + observation tokens = --new.
Printed: response tokens/s of each mode and the multi-turn / single-turn ratio of each repeat (median
over repeats; warm-up runs excluded), model and observation tokens, calls per row, the time share of
queueing the observations for the decode (turn_prefill.feed_observations, timed by wrapping the engine's own
function; the decode then feeds them a token a step inside its graphs), the decode steps
run, graph capture / compile time that fell inside timed runs (should be 0), and the rollout log-probs
of the model tokens against a from-scratch forward of a few rows (observations included: the cache the
decode built is the one a full forward computes).

How a random model calls a tool at a known rate. Its next-token distribution is near uniform, so X (the
format's end_id, the last vocabulary id) would come about once per vocabulary size of steps. Two in-place
weight edits, same shapes, so the decode does the same work:
  1. A beacon: the last layer's value bias (Qwen's qkv bias) is set to a fixed vector. Attention weights
     sum to one, so every position's attention output gains the same vector and the final norm's input
     a constant direction c (|c| = --beacon times the median hidden norm). Along any direction fitted to
     the plain random model's states the projection varies by prompt; along c it is near constant.
  2. X's output row (tied to its embedding, as in Qwen2.5-0.5B) becomes s * c / |c|. The scale s is solved
     on a forward pass over the warm-up single-turn run's rows: mean over their steps of p(X) = 1 /
     --turn-every, with p(X) = sigmoid(s * proj - logsumexp of the other logits), which the edit leaves
     alone. The baseline's measured frequency of X and the multi-turn calls per row are printed.

    python bench/multi_turn_generation.py --shape 0.5b                 # GPU: 32 prompts x 8, 512 tokens
    python bench/multi_turn_generation.py --tiny                       # a CPU smoke run
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Sequence

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from anywhere

from generation_bench import SHAPES, build, timed  # noqa: E402

from tandem.parallel import device  # noqa: E402
from tandem.tools.calls import ToolCall, ToolResult  # noqa: E402

OUT = os.environ.get("OUT") or tempfile.gettempdir()  # the device tool brings back $OUT


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)
    with open(os.path.join(OUT, "multi_turn_generation.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


class BenchFormat:
    """ToolFormat: X closes a call, any turn is one call, the answer is `obs` random vocabulary ids."""

    def __init__(self, end_id: int, obs: int, seed: int = 0):
        self.end_id, self.obs, self.rng = end_id, obs, random.Random(seed)

    def parse(self, turn: list[int]) -> list[ToolCall]:
        return [ToolCall("bench", {})]

    def observation(self, results: Sequence[ToolResult]) -> list[int]:
        return [self.rng.randrange(1, self.end_id) for _ in range(self.obs)]  # never pad (0) nor X


class InProcessCaller:
    """ToolCaller answering at once, or after an artificial latency (the other rows decode meanwhile)."""

    def __init__(self, latency_s: float):
        self.latency_s = latency_s

    async def call(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return [ToolResult("", True) for _ in calls]


class Probe:
    """Seconds and counts of one generate() call, by wrapping engine functions (the engine is unchanged)."""

    def __init__(self):
        from tandem.generation import multi_turn
        from tandem.generation.runner import ModelRunner

        self.t: dict[str, float] = defaultdict(float)
        multi_turn.feed_observations = self._timed(multi_turn.feed_observations, "feed_s")
        multi_turn.ToolTurns.resume = self._timed(multi_turn.ToolTurns.resume, "resume_s")
        execute = ModelRunner.execute

        def counted(runner, plan):
            self.t["decode_steps"] += plan.decode_steps
            self.t["slot_steps"] += plan.batch * plan.decode_steps
            return execute(runner, plan)
        ModelRunner.execute = counted

    def _timed(self, fn, key):
        def run(*a, **kw):  # the device is idle here (the engine synced on the alive flags)
            device.synchronize()
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            device.synchronize()
            self.t[key] += time.perf_counter() - t0
            return out
        return run

    def reset(self) -> None:
        self.t.clear()


def compiles() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def hidden_hook(model, grab: list, inputs: bool):
    """Collect the final norm's input (the residual stream) or output ([T, B, H]) of each forward."""
    return model.decoder.final_layernorm.register_forward_hook(
        lambda m, i, o: grab.append((i[0] if inputs else o).detach()))


@torch.no_grad()
def set_beacon(model, prompts: list[list[int]], strength: float, seed: int = 0) -> torch.Tensor:
    """Set the last layer's value bias so that the final norm's input gains a constant vector c of norm
    strength x the median hidden norm; returns c / |c| (fp32)."""
    from tandem.models.forward import forward_logits

    grab: list = []
    hook = hidden_hook(model, grab, inputs=True)
    try:
        ids = torch.tensor(prompts[:4], device=device.device())
        forward_logits(model, ids, torch.ones_like(ids))
    finally:
        hook.remove()
    norm = float(grab[0].float().norm(dim=-1).median())
    att = model.decoder.layers[-1].self_attention
    groups, heads = att.num_query_groups_per_partition, att.num_attention_heads_per_partition
    d, qpg = att.hidden_size_per_attention_head, heads // groups
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(groups, d, generator=g).to(device.device())
    a = v.repeat_interleave(qpg, 0).reshape(-1)  # query head h reads the values of group h // qpg
    c = att.linear_proj.weight.float() @ a
    k = strength * norm / float(c.norm())
    bias = att.linear_qkv.bias.data.view(groups, qpg + 2, d)  # megatron's layout per group: q heads, k, v
    bias[:, qpg + 1] = (k * v).to(bias.dtype)
    return c / c.norm()


@torch.no_grad()
def calibrate(model, res, x_id: int, direction: torch.Tensor, target: float, rows: int) -> dict:
    """Solve X's output row scale s so that X's mean probability over the steps of `rows` rows of a
    single-turn result is `target`; write the row. The logits come from the modules' forward."""
    from tandem.models.forward import forward_logits

    p, r = res.prompts.shape[1], res.responses.shape[1]
    vocab = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights \
        else model.output_layer.weight
    pick = list(range(0, res.responses.shape[0], max(1, res.responses.shape[0] // rows)))[:rows]
    chunk = max(1, (1 << 28) // ((p + r) * vocab.shape[0]))  # bounds the fp32 logits in memory
    proj, lse, grab = [], [], []
    hook = hidden_hook(model, grab, inputs=False)
    try:
        for j in range(0, len(pick), chunk):
            idx = pick[j:j + chunk]
            ids = torch.cat([res.prompts[idx], res.responses[idx]], 1).to(device.device())
            logits = forward_logits(model, ids, torch.ones_like(ids))[:, p - 1:p + r - 1].float()
            logits[..., x_id] = float("-inf")  # the other tokens' partition, which X's row does not change
            lse.append(torch.logsumexp(logits, -1).flatten())
            proj.append((grab.pop()[p - 1:p + r - 1].transpose(0, 1).float() @ direction).flatten())
    finally:
        hook.remove()
    proj, lse = torch.cat(proj), torch.cat(lse)

    def rate(s: float) -> float:
        return float(torch.sigmoid(s * proj - lse).mean())
    lo, hi = 0.0, 1.0
    while rate(hi) < target:
        if hi > 1e6:
            raise RuntimeError(f"X cannot reach rate {target}: the beacon's projection is {float(proj.mean()):.3g}")
        hi *= 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate(mid) < target else (lo, mid)
    vocab.data[x_id] = (hi * direction).to(vocab.dtype)
    return {"scale": hi, "predicted_rate": rate(hi), "target_rate": target, "calibration_steps": proj.numel(),
            "beacon_cv": float(proj.std() / proj.mean())}


@torch.no_grad()
def recompute_diff(model, res, rows: int) -> float:
    """Max |rollout log-prob - a from-scratch forward's| over the model tokens of the first `rows` rows:
    bf16 noise when the decode's cache (observations included) is what a full forward computes."""
    from tandem.models.forward import forward_logits

    worst = 0.0
    p = res.prompts.shape[1]
    for i in range(min(rows, res.prompts.shape[0])):
        seq = torch.cat([res.prompts[i], res.responses[i]])[None].to(device.device())
        logits = forward_logits(model, seq, torch.ones_like(seq))[0, p - 1:-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, seq[0, p:, None])[:, 0].cpu()
        model_tok = res.response_mask[i].bool()
        if res.observation_mask is not None:
            model_tok &= ~res.observation_mask[i].bool()
        worst = max(worst, float((logp - res.rollout_log_probs[i]).abs()[model_tok].max()))
    return worst


def measure(engine, probe, prompts, params, tools, x_id) -> tuple[dict, object]:
    from tandem.generation.graphs import CAPTURE_SECONDS

    probe.reset()
    capture, compiled = CAPTURE_SECONDS[0], compiles()
    box = []
    wall = timed(lambda: box.append(engine.generate(prompts, params, tools=tools)))
    res = box[0]
    mask = res.response_mask.bool()
    obs = res.observation_mask.bool() if res.observation_mask is not None else torch.zeros_like(mask)
    tokens, obs_tokens = int(mask.sum()), int(obs.sum())
    out = {"wall_s": wall, "tokens": tokens, "model_tokens": tokens - obs_tokens, "obs_tokens": obs_tokens,
           "tok_s": tokens / wall, "model_tok_s": (tokens - obs_tokens) / wall,
           "x_per_model_token": int(((res.responses == x_id) & mask & ~obs).sum()) / max(1, tokens - obs_tokens),
           "decode_steps": int(probe.t["decode_steps"]),
           "mean_batch": probe.t["slot_steps"] / max(1, probe.t["decode_steps"]),
           "capture_s": CAPTURE_SECONDS[0] - capture, "compiles": compiles() - compiled}
    if res.tool_calls is not None:
        calls = res.tool_calls.float()
        cont = probe.t["feed_s"]
        out.update(calls_per_row=float(calls.mean()), calls_min=int(calls.min()), calls_max=int(calls.max()),
                   feed_s=cont, feed_share=None if cont is None else cont / wall,
                   resume_other_s=probe.t["resume_s"] - (cont or 0.0))
    return out, res


def machine() -> dict:
    def git(*a):
        try:
            return subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:  # no git on the machine
            return ""
    return {"device": torch.cuda.get_device_name() if device.has_cuda() else f"cpu ({os.cpu_count()} cores)",
            "torch": torch.__version__, "megatron_core": importlib.metadata.version("megatron-core"),
            "python": platform.python_version(),
            "commit": (git("rev-parse", "--short", "HEAD") or "unknown (no git here)")
            + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (rows = prompts x n)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new", type=int, default=512, help="response tokens per row, observations included")
    ap.add_argument("--turn-every", type=float, default=64, help="mean model tokens per turn (1 / P(X) a step)")
    ap.add_argument("--obs", type=int, default=16, help="observation tokens per call")
    ap.add_argument("--latency-ms", default="0,50", help="tool latencies to run, each against the baseline")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--beacon", type=float, default=1.0, help="|c| over the median hidden norm")
    ap.add_argument("--calibration-rows", type=int, default=16)
    ap.add_argument("--sync-every", type=int, default=None, help="engine default (8 on GPU) if unset")
    ap.add_argument("--check-rows", type=int, default=8, help="rows checked against a from-scratch forward")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run")
    args = ap.parse_args()
    if args.tiny:
        args.shape, args.prompts, args.n, args.prompt_len, args.new = "tiny", 2, 4, 16, 96
        args.turn_every, args.obs, args.latency_ms, args.repeats, args.calibration_rows = 16, 4, "0,10", 3, 8

    from tandem.generation.engine import GenerationEngine, _pow2_buckets
    from tandem.generation.multi_turn import MultiTurn
    from tandem.generation.sampling import SamplingParams
    from tandem.parallel.layout import ParallelConfig, init_distributed

    init_distributed(ParallelConfig(), 0, 1, seed=1)
    dtype = torch.bfloat16 if device.has_cuda() else torch.float32
    shape = SHAPES[args.shape]
    vocab, x_id, rows = shape.vocab_size, shape.vocab_size - 1, args.prompts * args.n
    emit({**machine(), "dtype": str(dtype), **{k: v for k, v in vars(args).items() if k != "tiny"}, "rows": rows,
          "x_id": x_id, "tied": shape.tie_word_embeddings})
    model = build(shape, dtype)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, x_id, (args.prompts, args.prompt_len), generator=g).tolist()
    engine = GenerationEngine(model, pad_id=0, eos_id=-1, vocab_size=vocab, max_batch_size=rows,
                              sync_every=args.sync_every)
    probe = Probe()
    latencies = [float(s) for s in args.latency_ms.split(",")]
    fmt = BenchFormat(x_id, args.obs)

    def tools(latency_ms):
        return MultiTurn(InProcessCaller(latency_ms / 1e3), fmt, timeout_s=60.0 + latency_ms / 1e3, retries=0)

    def params(new):
        return SamplingParams(max_new_tokens=new, temperature=1.0, n=args.n, seed=1)

    direction = set_beacon(model, prompts, args.beacon)
    t0 = time.perf_counter()
    single = measure(engine, probe, prompts, params(args.new), None, x_id)[1]  # warm-up; its rows calibrate X
    # Compile and capture before timing: decode compiles once per batch size and captures per (batch,
    # attended length), and a multi-turn run's batch shrinks as rows that waited on tools finish last.
    for b in _pow2_buckets(rows)[:-1]:
        if b >= args.n:
            for mt in (None, tools(0.0)):
                engine.generate(prompts[:b // args.n], params(args.new), tools=mt)
    cal = calibrate(model, single, x_id, direction, 1 / args.turn_every, args.calibration_rows)
    emit({"calibration": cal})
    for lat in latencies:
        measure(engine, probe, prompts, params(args.new), tools(lat), x_id)
    emit({"warm_up_s": time.perf_counter() - t0})

    runs, last = defaultdict(list), {}
    for rep in range(args.repeats):
        base, last["single"] = measure(engine, probe, prompts, params(args.new), None, x_id)
        runs["single"].append(base)
        emit({"rep": rep, "mode": "single-turn", **base})
        for lat in latencies:
            rec, last[lat] = measure(engine, probe, prompts, params(args.new), tools(lat), x_id)
            rec["ratio"] = rec["tok_s"] / base["tok_s"]
            runs[lat].append(rec)
            emit({"rep": rep, "mode": "multi-turn", "latency_ms": lat, **rec})
    diffs = {mode: recompute_diff(model, res, args.check_rows) for mode, res in last.items()}
    emit({"logp_diff_max": diffs})
    summarize(runs, latencies, args, cal)
    print("rollout log-probs of the model tokens against a from-scratch forward (first "
          f"{args.check_rows} rows of the last repeat), max |diff|: "
          + ", ".join(f"{'single-turn' if m == 'single' else f'multi-turn {m:g} ms'} {d:.3g}" for m, d in diffs.items()))


def summarize(runs, latencies, args, cal) -> None:
    def med(recs, key):
        vals = [r[key] for r in recs if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    print(f"\n{args.shape}: {args.prompts} prompts x {args.n}, {args.prompt_len}-token prompts, {args.new} response "
          f"tokens a row; a turn every {args.turn_every:g} model tokens, {args.obs} observation tokens a call; "
          f"medians of {args.repeats} repeats\n")
    print("| mode | tool latency ms | tok/s | ratio to single-turn | model tok/s | model tokens | observation "
          "tokens | calls/row (min-max) | observation feed share | decode steps | capture s, compiles in timed runs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    single = runs["single"]
    print(f"| single-turn | - | {med(single, 'tok_s'):,.0f} | 1 | {med(single, 'model_tok_s'):,.0f} | "
          f"{single[0]['model_tokens']} | 0 | - | - | {med(single, 'decode_steps'):.0f} | {sum(r['capture_s'] for r in single):.2f}, "
          f"{sum(r['compiles'] for r in single)} |")
    for lat in latencies:
        rs = runs[lat]
        share = med(rs, "feed_share")
        print(f"| multi-turn | {lat:g} | {med(rs, 'tok_s'):,.0f} | **{med(rs, 'ratio'):.3f}** | "
              f"{med(rs, 'model_tok_s'):,.0f} | {med(rs, 'model_tokens'):.0f} | {med(rs, 'obs_tokens'):.0f} | "
              f"{med(rs, 'calls_per_row'):.2f} ({min(r['calls_min'] for r in rs)}-{max(r['calls_max'] for r in rs)}) "
              f"| {'-' if share is None else f'{share:.1%}'} | {med(rs, 'decode_steps'):.0f} | "
              f"{sum(r['capture_s'] for r in rs):.2f}, {sum(r['compiles'] for r in rs)} |")
    same = all(r["tokens"] == single[0]["tokens"] for rs in runs.values() for r in rs)
    print(f"\nsame total response tokens in every run: {same}; X sampled in single-turn at "
          f"{med(single, 'x_per_model_token') * args.turn_every:.2f}x the target rate (calibration: "
          f"{cal['predicted_rate'] * args.turn_every:.2f}x predicted, beacon spread {cal['beacon_cv']:.1%})")


if __name__ == "__main__":
    main()
