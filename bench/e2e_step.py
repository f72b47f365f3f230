"""The whole GRPO step on one device, through the real services, against its roofline.

    python bench/e2e_step.py --shape 0.5b --steps 5 --out /tmp/e2e            # GPU, bf16
    python bench/e2e_step.py --shape 0.5b --steps 5 --out /tmp/e2e \
        --compare actor_rollout_ref.actor.use_torch_compile=false      # before / after in one call
    python bench/e2e_step.py --tiny --out /tmp/e2e-tiny                        # CPU smoke (fp32)
    python bench/e2e_step.py --shape 7b --config deploy/configs/one_gpu_7b.yaml --prompts 32 --steps 4 \
        --out /tmp/e2e-7b                     # a user's config file, as `tandem run FILE` runs it
    python bench/e2e_step.py --shape 0.5b --steps 4 --out /tmp/e2e-prof \
        actor_rollout_ref.actor.profile.use_profile=true actor_rollout_ref.actor.profile.step_start=3 \
        actor_rollout_ref.actor.profile.step_end=4     # trace of step 3: runs/baseline-r0-*/profile/
    python bench/trace_gaps.py /tmp/e2e-prof/runs/baseline-r0-*/profile/actor_rank0_step3.json

Builds a random-init Qwen2.5-shaped checkpoint (bench/random_qwen2.py) and the data (prompts of
--prompt-min..--prompt-max characters of the built-in task's alphabet, sums of several numbers)
under --out, then runs `tandem run` (python -m tandem.controller run: the real controller, the local
launcher, actor colocated with its rollout, reward service) in a subprocess per configuration:
--prompts x --n rows, --new-tokens per response, GRPO with the KL loss, no SFT. Each run's
metrics.jsonl gives verl's timing_s/* per phase and perf/throughput (tokens/s/GPU); the services'
`compile.spent` and `gc.paused` log lines give what each step spent in torch.compile and CUDA graph
capture, and in Python's garbage collection (tandem/serving/call_observer.py). Before the runs this process measures the matmul rate at the
model's GEMM shapes and the device copy rate (bench/e2e_roofline.py), from which each step's
roofline: training and log-prob FLOPs at the matmul rate; generation's KV-cache reads at the copy
rate and its decode GEMMs at the slower of their weight reads and their FLOPs (at 512 rows the
FLOPs). The table also gives the step's share of the bytes-only generation bound, the earlier figure.

--compare KEY=VALUE (repeatable, one variant each; `K1=V1,K2=V2`: one variant of several keys) runs
the baseline and every variant in alternation, --repeats times, and prints each variant's step and phase times over the
baseline's: a before / after in one call. A failed run is reported and the others go on.
Results are printed as they come and appended to --out/results.md (and results.jsonl); then each
run's steady steps one by one, and the roofline of the work the prompt-sharing actor does
(each prompt once per group) beside the table's (every row's prompt). The printing: e2e_report.py.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_roofline as roof  # noqa: E402
from e2e_report import HEAD, PHASES, cold_start_lines, compare_lines, row, step_lines  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tandem.serving import call_observer as observed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPILE_PHASES = [*observed.PHASES, *observed.CACHE_COUNTS]  # compile.spent's split of the time, its caches' answers


def variant_keys(text: str) -> list[str]:
    """One --compare value -> its overrides: `K1=V1,K2=V2` is several keys (a comma starts a new one
    only before `dotted.key=`, so list values such as `[console,jsonl]` stay whole)."""
    return [kv for kv in re.split(r",(?=[A-Za-z_][\w.]*=)", text) if kv]


def shape_of(name: str) -> dict:
    from weight_sync_transports import SHAPES

    return SHAPES[name]


def build_inputs(a, out: str) -> tuple[str, str, str]:
    """The checkpoint (reused when present) and train / val parquet files -> their paths."""
    ckpt = os.path.join(out, f"ckpt-{a.shape}")
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "random_qwen2.py"), a.shape, ckpt], check=True,
                       env=_env())
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tandem.tasks.arithmetic import DATA_SOURCE

    rng = random.Random(0)
    paths = []
    for name, count in (("train", a.prompts * (a.steps + 1) * a.repeats * (1 + len(a.compare))), ("val", 8)):
        rows = []
        for i in range(count):
            length, terms = rng.randint(a.prompt_min, a.prompt_max), []
            while sum(len(t) + 1 for t in terms) < length - 4:
                terms.append(str(rng.randint(0, 999)))
            text = "+".join(terms)[: length - 1] .rstrip("+") + "="
            total = sum(int(t) for t in text[:-1].split("+") if t)
            rows.append({"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": text}],
                         "reward_model": {"style": "rule", "ground_truth": str(total)},
                         "extra_info": {"split": name, "index": i}})
        path = os.path.join(out, f"{name}.parquet")
        pq.write_table(pa.Table.from_pylist(rows), path)
        paths.append(path)
    return ckpt, paths[0], paths[1]


def overrides(a, ckpt: str, train: str, val: str, out: str, name: str) -> list[str]:
    micro = 8 if a.tiny else a.micro_batch
    return [f"actor_rollout_ref.model.path={ckpt}", f"data.train_files={train}", f"data.val_files={val}",
            f"trainer.default_local_dir={out}/runs", f"trainer.experiment_name={name}",
            "trainer.sft.total_steps=0", f"trainer.total_training_steps={a.steps}", "trainer.test_freq=0",
            "trainer.save_freq=0", "trainer.max_restarts=0", "trainer.logger=[console,jsonl]",
            f"data.train_batch_size={a.prompts}", f"actor_rollout_ref.rollout.n={a.n}",
            f"data.max_prompt_length={a.prompt_max + 8}", f"data.max_response_length={a.new_tokens}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={a.mini_batch or a.prompts}",
            *([f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
               f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}"] if micro else []),
            *(["actor_rollout_ref.actor.use_dynamic_bsz=true",
               f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={a.max_tokens}"] if a.max_tokens else []),
            "actor_rollout_ref.actor.use_kl_loss=true", "algorithm.use_kl_in_reward=false",
            "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
            f"actor_rollout_ref.rollout.max_batch_size={a.prompts * a.n}", "services.startup_timeout_s=900",
            *([] if a.tiny else ["actor_rollout_ref.actor.megatron.dtype=bfloat16"])]


def _env() -> dict:
    pythonpath = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=pythonpath, PYTHONUNBUFFERED="1")


def run_one(a, base: list[str], extra: list[str], name: str, out: str) -> dict:
    """One `tandem run` -> {'steps': [metrics per RL step], 'compile': {rl_step: (compile_s, capture_s)}, ...}."""
    t0 = time.time()
    log = os.path.join(out, f"{name}.log")
    with open(log, "w") as f:  # its own session: a run past --run-timeout is stopped with its services
        config = [a.config] if a.config else []  # a user's config file: `tandem run FILE key=value ...`
        proc = subprocess.Popen([sys.executable, "-m", "tandem.controller", "run", *config, *base, *extra], cwd=ROOT,
                                env=_env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = _wait_or_stop(proc, a.run_timeout)
    wall = time.time() - t0
    runs = sorted(glob.glob(os.path.join(out, "runs", f"{name}-*")))
    metrics = os.path.join(runs[-1], "metrics.jsonl") if runs else ""
    steps = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            steps = [m for m in map(_json, f) if m and "timing_s/step" in m]
    # a run stopped at --run-timeout still reports the steps it finished (marked in the table)
    if (proc.returncode and not timed_out) or not steps:
        with open(log) as f:
            tail = f.read()[-2500:]
        why = f"stopped at --run-timeout {a.run_timeout:.0f} s" if timed_out else f"exited {proc.returncode}"
        raise RuntimeError(f"{name}: tandem run {why} after {wall:.0f} s, {len(steps)} steps (log {log}):\n{tail}")
    run_dir = runs[-1]
    spent: dict = {}
    phases: dict = {}  # rl_step -> summed COMPILE_PHASES
    paused: dict = {}  # rl_step -> (seconds in garbage collection, full collections)
    rpcs = []  # (time, method, seconds) of every served call: when the services first answered, the final save
    for path in glob.glob(os.path.join(run_dir, "logs", "*.log")):
        with open(path) as f:
            for line in f:
                e = _json(line)
                if e and e.get("event") == "rpc" and "timestamp" in e:
                    rpcs.append((_epoch(e["timestamp"]), e.get("method", ""), e.get("ms", 0.0) / 1e3))
                if e and e.get("event") == "gc.paused":  # Python's collector stopped the process (all ranks summed)
                    g, full = paused.get(e.get("rl_step"), (0.0, 0))
                    paused[e.get("rl_step")] = (g + e["gc_s"], full + e["full"])
                if e and e.get("event") == "compile.spent":
                    c, g = spent.get(e.get("rl_step"), (0.0, 0.0))
                    spent[e.get("rl_step")] = (c + e["compile_s"], g + e["graph_capture_s"])
                    split = phases.setdefault(e.get("rl_step"), {})
                    for k in COMPILE_PHASES:
                        split[k] = split.get(k, 0.0) + e.get(k, 0.0)
                    split["calls"] = split.get("calls", 0) + 1  # and in how many inductor's worker pool was up
                    split["pool_up"] = split.get("pool_up", 0) + int(bool(e.get("compile_pool_up")))
    kept = os.path.join(run_dir, "checkpoints")
    left = sorted(os.listdir(kept)) if os.path.isdir(kept) else []  # what the run left on disk (none at save_freq <= 0)
    shutil.rmtree(kept, ignore_errors=True)  # GBs each; metrics and logs stay
    saves = [r for r in sorted(rpcs) if r[1].endswith("SaveCheckpoint")]
    return {"name": name, "extra": extra, "steps": steps, "compile": spent, "compile_phases": phases, "gc": paused,
            "wall_s": wall,
            "run_dir": run_dir, "timed_out": timed_out,
            # launch to the services' first answered call: process start, imports, model build and load
            "startup_s": min(r[0] for r in rpcs) - t0 if rpcs else float("nan"),
            "final_save_s": saves[-1][2] if saves else float("nan"), "checkpoints_left": left}


def _epoch(stamp: str) -> float:
    """A log line's ISO-8601 UTC timestamp -> seconds since the epoch (time.time()'s clock)."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _wait_or_stop(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait for the run; past `timeout`, stop its whole process group (controller and services: the
    GPU must be free for the next run), SIGTERM then SIGKILL. -> whether it was stopped."""
    try:
        proc.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        pass
    for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    return True


def _json(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None


def summarise(res: dict, a, s: dict, r: dict) -> dict:
    steps = res["steps"]
    steady = steps[1:] or steps
    med = lambda k: statistics.median(m.get(k, 0.0) for m in steady)  # noqa: E731
    rows = a.prompts * a.n
    work = [roof.step_work(s, m, rows, 1, 4 if a.tiny else 2) for m in steady]
    shared = a.n  # the dense actor computes each prompt once per group (the roofline of that work, too)
    # the old pass skips the rows the update computes itself: the first mini-batch (one: every row)
    own = a.mini_batch * a.n if 0 < a.mini_batch < a.prompts else rows
    old_share = (rows - own) / rows
    # log-prob passes the step ran: old log-probs (rows left after the update's own) and reference (KL)
    passes = int(own < rows) + int(med("timing_s/ref") > 0)
    done = old_share + int(med("timing_s/ref") > 0)
    lines = [roof.roofline(w, r, passes) for w in work]
    step_s = med("timing_s/step")
    mfu_train = statistics.median(w.train_flops / max(m["timing_s/update_actor"], 1e-9) for w, m in zip(work, steady))
    # the two calls start together (controller/step.py gathers them) and queue on the actor's one worker
    # thread: the later one's timing includes waiting for the other, so the pair's wall time is the max
    lp_s = [max(m.get("timing_s/old_log_prob", 0.0), m.get("timing_s/ref", 0.0)) for m in steady]
    mfu_lp = statistics.median(done * w.logprob_flops / t if t > 0 else float("nan") for w, t in zip(work, lp_s))
    first = steps[0]["timing_s/step"] if steps else float("nan")
    c1 = res["compile"].get(1, (0.0, 0.0))
    c0 = res["compile"].get(None, (0.0, 0.0))
    roof_s = statistics.median(x["step"] for x in lines)
    # the roofline of the work the step did: prompts once per group (shared), the old pass over old_share
    work_roof_s = statistics.median(roof.roofline(roof.step_work(s, m, rows, 1, 4 if a.tiny else 2, shared), r,
                                                  done)["step"] for m in steady)
    # what no phase timer covers: the controller's own work between the calls (batching, data metrics), the
    # weight sync before generation, and gaps; old and reference log-probs overlap (their max)
    other = statistics.median(m["timing_s/step"] - lp - sum(m.get(f"timing_s/{p}", 0.0) for p in
                                                             ("gen", "reward", "adv", "update_actor"))
                              for m, lp in zip(steady, lp_s))
    return {"name": res["name"], "extra": res["extra"], "step_s": step_s,
            **{p: med(f"timing_s/{p}") for p in PHASES}, "tokens_s_gpu": med("perf/throughput"),
            "mfu_train": mfu_train / r["matmul_flops"], "mfu_logprob": mfu_lp / r["matmul_flops"],
            "roofline_s": roof_s, "roof_parts": {k: statistics.median(x[k] for x in lines) for k in lines[0]},
            "fraction": roof_s / step_s, "other_s": other, "first_step_s": first,
            "shared": shared, "old_share": old_share, "work_roofline_s": work_roof_s,
            # each steady step's own figures: a slow step next to fast ones (e.g. a recompile) shows here
            "per_step": [{k: m.get(f"timing_s/{k}", 0.0) for k in ("step", "old_log_prob", "ref", "update_actor")}
                         | {"compile_s": sum(res["compile"].get(m.get("step", i + 2), (0.0, 0.0))),
                            "gc": res["gc"].get(m.get("step", i + 2), (0.0, 0))}
                         for i, m in enumerate(steady)],
            "first_compile_s": c1[0], "first_capture_s": c1[1],
            "first_compile_phases": res["compile_phases"].get(1, {}),
            "before_compile_s": c0[0], "before_capture_s": c0[1], "wall_s": res["wall_s"], "steps": len(steps),
            "startup_s": res["startup_s"], "final_save_s": res["final_save_s"],
            "checkpoints_left": res["checkpoints_left"],
            "response_mean": med("response_length/mean"), "prompt_mean": med("prompt_length/mean"),
            "probs_diff_max": max((m.get("training/rollout_probs_diff_max", 0.0) for m in steps), default=0.0),
            "ppo_kl_first": steps[0].get("actor/ppo_kl") if steps else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="0.5b", choices=["0.5b", "1.5b", "7b", "cpu-small"])
    p.add_argument("--tiny", action="store_true", help="CPU smoke: cpu-small shape, fp32, 4 prompts x 2, 8 tokens")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--prompt-min", type=int, default=128)
    p.add_argument("--prompt-max", type=int, default=256)
    p.add_argument("--mini-batch", type=int, default=16, help="ppo_mini_batch_size in prompts (0: all)")
    p.add_argument("--micro-batch", type=int, default=0,
                   help="rows per micro-batch (update and log-probs); 0: Tandem's default micro-batching")
    p.add_argument("--max-tokens", type=int, default=0,
                   help="micro-batches by a token budget instead (actor.use_dynamic_bsz, ppo_max_token_len_per_gpu)")
    p.add_argument("--config", help="a config file every run starts from, as `tandem run FILE` (e.g. "
                   "deploy/configs/one_gpu_7b.yaml); the bench's keys and the overrides go on top")
    p.add_argument("--compare", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                   help="a variant (repeatable); several keys in one variant separated by commas")
    p.add_argument("--repeats", type=int, default=1, help="runs of each configuration, alternating")
    p.add_argument("--run-timeout", type=float, default=1800)
    p.add_argument("--out", required=True)
    p.add_argument("overrides", nargs="*", help="dotted keys for every run (baseline and variants)")
    a = p.parse_args(argv)
    if a.tiny:
        a.shape, a.prompts, a.n, a.new_tokens, a.mini_batch = "cpu-small", 4, 2, 8, 0
        a.prompt_min, a.prompt_max = 16, 32
        a.steps = min(a.steps, 2)
    import torch

    os.makedirs(a.out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() and not a.tiny else "cpu"
    s = shape_of(a.shape)
    r = roof.rates(s, dev, torch.float32 if a.tiny else torch.bfloat16)
    where = (torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or platform.machine())
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    micro_text = (f"micro-batches of up to {a.max_tokens} tokens" if a.max_tokens else
                  f"micro-batch {8 if a.tiny else a.micro_batch} rows" if a.tiny or a.micro_batch else
                  "Tandem's default micro-batches")
    header = [f"## e2e GRPO step, {a.shape}, {stamp}", "",
              f"- command: `python bench/e2e_step.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
              f"- machine: {where}, {os.cpu_count()} CPUs, torch {torch.__version__}; "
              f"{roof.weight_count(s) / 1e9:.3f}B weights; measured here: matmul "
              f"{r['matmul_flops'] / 1e12:.3g} TFLOP/s at the model's GEMMs, "
              f"copy {r['copy_bytes'] / 1e9:.0f} GB/s",
              f"- config: {a.prompts} prompts x {a.n}, prompts {a.prompt_min}-{a.prompt_max} chars, {a.new_tokens} new "
              f"tokens, mini-batch {a.mini_batch or a.prompts} prompts, "
              f"{micro_text}, " + (f"config file {a.config}, " if a.config else "") +
              f"KL loss, {'fp32 CPU' if a.tiny else 'bf16'}, colocated; "
              f"{a.steps} steps per run, medians of steps 2..N; "
              "MFU = the phase's model FLOPs / its time / the matmul rate above",
              "", HEAD, "| --- " * HEAD.count(" | ") + "| --- |"]
    print("\n".join(header), flush=True)
    results = os.path.join(a.out, "results.md")
    with open(results, "a") as f:
        f.write("\n".join(header) + "\n")
    ckpt, train, val = build_inputs(a, a.out)
    configs = [("baseline", [])] + [(f"variant{i + 1}", variant_keys(kv)) for i, kv in enumerate(a.compare)]
    done: dict[str, list] = {}
    for rep in range(a.repeats):
        for name, extra in configs:
            tag = f"{name}-r{rep}"
            try:
                res = run_one(a, [*overrides(a, ckpt, train, val, a.out, tag), *a.overrides], extra, tag, a.out)
                x = summarise(res, a, s, r)
                x["name"] = name + (f" ({' '.join(extra)})" if extra else "")
                if res["timed_out"]:
                    x["name"] += f" [stopped at --run-timeout after {len(res['steps'])} steps]"
                done.setdefault(name, []).append(x)
                line = row(x)
            except Exception as e:  # one failure must not lose the other runs
                line = f"| {tag} | FAILED: {str(e)[-1500:]!r} |"
                x = {"name": tag, "error": str(e)}
            print(line, flush=True)
            with open(results, "a") as f:
                f.write(line + "\n")
            with open(os.path.join(a.out, "results.jsonl"), "a") as f:
                f.write(json.dumps({**x, "rates": r, "shape": a.shape}, default=str) + "\n")
    tail = ["", *compare_lines(done), *cold_start_lines(done), *step_lines(done),
            *(f"- {k}: rollout_probs_diff_max max over steps {v[0]['probs_diff_max']:.3g}, actor/ppo_kl of step 1 "
              f"{v[0]['ppo_kl_first']}, run wall {v[0]['wall_s']:.0f} s" for k, v in done.items()), ""]
    print("\n".join(tail), flush=True)
    with open(results, "a") as f:
        f.write("\n".join(tail) + "\n")
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main())
