"""GRPO, colocated, KL loss on (the reference is live), on a Qwen2.5-7B-shaped checkpoint on one GPU:
peak GPU and host memory and the step time, from checkpoint to the last step in one command.

    python bench/grpo_7b.py [--steps 3] [--prompts 32] [--n 8] [--new-tokens 512] [--fraction F]
    python bench/grpo_7b.py --shape tiny --prompts 4 --n 2 --new-tokens 8 --steps 2    # CPU smoke
    python bench/grpo_7b.py --out DIR KEY=VALUE ...    # any config key on top (a variant to compare)

1. bench/make_checkpoint.py writes the random-init bf16 checkpoint (15 GB at 7B; kept if present).
2. The actor (colocated: it serves RolloutService on the policy's own weights) and the reward
   service start as `tandem run` starts them (the local launcher, real processes, real gRPC).
3. `--steps` RL steps of tandem.controller.step.ppo_step (the controller's own step) on the built-in
   arithmetic prompts: n samples per prompt, `--new-tokens` new tokens (a random model rarely
   stops early), reward, old and reference log-probs, the update. No SFT, no validation and no
   final checkpoint (a 7B actor's checkpoint with optimizer state is ~120 GB).

Memory settings: deploy/configs/one_gpu_7b.yaml, the config a user runs with `tandem run` (on CPU
without megatron's CPU optimizer offload, which needs CUDA; `--no-offload` drops the file for a
baseline that does not fit at 7B); micro-batches by its token budget unless `--micro` gives rows:
  - bf16 parameters, megatron's distributed optimizer (one GPU: it holds the whole state), and
    its CPU optimizer offload: Adam for `--fraction` of the parameters runs on the CPU with its
    fp32 weights and moments in host memory (optim.override_optimizer_config);
  - actor.megatron.grad_offload (the fp32 gradient buffer, 30 GB, is dropped outside training),
    ref.megatron.param_offload (the reference, 15 GB, in pinned host memory except while it
    computes), rollout.free_cache_engine (the KV cache freed before log-probs and training).
Per phase, on the GPU at the config's fraction 0.2 (GB): generation 15 policy + 73 GPU share of
the optimizer + ~9 KV cache; log-probs 15 + 73 (+ the 15 of the reference for its own pass);
training 15 + 30 gradients + 73 + activations. Host: 18 (CPU Adam share: fp32 weights and
moments) + 6 (its pinned fp32 gradient copy) + 15 (reference) + the processes.
Prints per step: seconds (and the phases'), the actor's perf/max_memory_allocated_gb and
perf/max_memory_reserved_gb (peaks since the previous update, i.e. over the step), its
perf/cpu_memory_used_gb, and the host peaks polled every 0.5 s (the services' RSS summed, and
the machine's used memory); then the setup times, with the actor's start-up phases (its
LifecycleService.Describe: process start, model builds, checkpoint load, optimizer, ...; what is
left of "services up" is the gRPC server's start and the controller's connect).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.make_checkpoint import make_checkpoint  # noqa: E402
from tandem.algos.kl import get_kl_controller  # noqa: E402
from tandem.config import load_config  # noqa: E402
from tandem.controller.clients import LifecycleClient  # noqa: E402
from tandem.controller.data import Cursor, collate, load_examples  # noqa: E402
from tandem.controller.launchers import LaunchContext, endpoints  # noqa: E402
from tandem.controller.launchers.local import LocalLauncher  # noqa: E402
from tandem.controller.roles import connect, needed_roles, security  # noqa: E402
from tandem.controller.run_dir import create_run_dir  # noqa: E402
from tandem.controller.step import StepContext, ppo_step  # noqa: E402
from tandem.logging import configure_logging  # noqa: E402

A = "actor_rollout_ref.actor"
CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy", "configs", "one_gpu_7b.yaml")
GIB = 1024 ** 3
PHASES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor"]  # timing_s/<phase> (verl's names)


def overrides(a, cuda: bool) -> tuple[str | None, list[str]]:
    """(the config file, the bench's keys on top): the memory settings are the user's config file's."""
    o = f"{A}.optim.override_optimizer_config"
    out = [f"actor_rollout_ref.model.path={a.checkpoint}", f"actor_rollout_ref.rollout.n={a.n}",
           f"data.train_batch_size={a.prompts}", f"data.max_response_length={a.new_tokens}",
           f"{A}.ppo_mini_batch_size={a.mini}", f"actor_rollout_ref.rollout.max_batch_size={a.prompts * a.n}",
           f"{A}.optim.lr=1e-6", "trainer.sft.total_steps=0", "trainer.test_freq=0", "trainer.save_freq=-1",
           "data.builtin_train_size=2000", "data.builtin_val_size=8",
           f"services.startup_timeout_s={a.startup_timeout}", "services.rpc_timeout_s=1800"]
    if a.threads:
        out.append(f"services.actor.torch_threads={a.threads}")
    if a.micro:  # rows instead of the config's token budget
        out += [f"{A}.ppo_micro_batch_size_per_gpu={a.micro}",
                f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={a.micro * 2}"]
    if a.no_offload:
        return None, out + ["algorithm.adv_estimator=grpo", f"{A}.use_kl_loss=true", f"{A}.kl_loss_type=low_var_kl",
                            f"{A}.megatron.dtype={'bfloat16' if cuda else 'float32'}"]
    if not cuda:  # megatron's CPU optimizer offload needs CUDA: the rest of the config runs on CPU
        out += [f"{A}.megatron.dtype=float32", f"{o}.optimizer_cpu_offload=false", f"{o}.optimizer_offload_fraction=0",
                f"{o}.use_precision_aware_optimizer=false", f"{o}.overlap_cpu_optimizer_d2h_h2d=false"]
    elif a.fraction is not None:
        out += [f"{o}.optimizer_offload_fraction={a.fraction}"]
    return CONFIG, out


def cpu_adam_fraction(config: str | None, keys: list[str]) -> float:
    """The share of Adam on the CPU that the run will have (0: none)."""
    o = load_config(config, keys).actor_rollout_ref.actor.optim.override_optimizer_config
    return float(o.get("optimizer_offload_fraction") or 0) if o.get("optimizer_cpu_offload") else 0.0


class HostPeaks(threading.Thread):
    """Polls the services' summed RSS (with their children) and the machine's used memory."""

    def __init__(self, launcher: LocalLauncher, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.launcher, self.every_s = launcher, every_s
        self.services_gb = self.machine_gb = 0.0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            rss = 0
            for proc in list(self.launcher.processes.values()):
                try:
                    p = psutil.Process(proc.pid)
                    rss += sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
                except psutil.Error:
                    pass
            self.services_gb = max(self.services_gb, rss / GIB)
            self.machine_gb = max(self.machine_gb, psutil.virtual_memory().used / GIB)


async def run_steps(cfg, run_dir: str, steps: int, out_json: str) -> tuple[list[dict], dict]:
    from transformers import AutoTokenizer

    run_id = os.path.basename(run_dir)
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.tokenizer_path)
    d, k, s = cfg.data, cfg.algorithm.kl_ctrl, cfg.services
    train = load_examples(d.train_files, tokenizer, d.max_prompt_length)
    cursor = Cursor(len(train), seed=d.seed, shuffle=d.shuffle)
    roles = needed_roles(cfg)
    launcher = LocalLauncher(LaunchContext(os.path.join(run_dir, "config.yaml"), run_dir, run_id,
                                           s.startup_timeout_s))
    peaks = HostPeaks(launcher)
    out, setup, clients = [], {}, None
    try:
        t0 = time.perf_counter()
        started = asyncio.create_task(endpoints(launcher, roles, {}))
        await asyncio.sleep(0)
        peaks.start()
        eps = await started
        clients = await connect(cfg, eps, run_id, tokenizer.pad_token_id)
        setup["services_start_s"] = time.perf_counter() - t0
        setup["actor_startup"] = await startup_phases(cfg, eps["actor"])
        ctx = StepContext(clients, cfg, tokenizer, get_kl_controller(k.type, k.kl_coef, k.target_kl, k.horizon))
        for step in range(1, steps + 1):
            clients.set_step(step)
            prompts = collate([train[i] for i in cursor.next(d.train_batch_size)], tokenizer.pad_token_id)
            metrics = await ppo_step(ctx, prompts, step)
            metrics.update(host_services_peak_gb=peaks.services_gb, host_machine_peak_gb=peaks.machine_gb)
            out.append(metrics)
            print(step_line(step, metrics), flush=True)
            with open(out_json, "w") as f:  # what finished so far, should a later step fail
                json.dump({"steps": out, "setup": setup, "run_dir": run_dir}, f, indent=1)
    except BaseException as e:  # say where it stopped, with the actor's last words, then fail
        log = launcher.logs.get("actor")
        tail = open(log, errors="replace").read()[-6000:] if log and os.path.isfile(log) else "(no actor log)"
        print(f"run stopped after {len(out)} step(s): {type(e).__name__}: {e}\n--- actor log tail ({log}):\n{tail}",
              flush=True)
        raise
    finally:
        peaks.stopped.set()
        if clients is not None:
            await clients.close()
        launcher.stop()
    setup.update(host_services_peak_gb=peaks.services_gb, host_machine_peak_gb=peaks.machine_gb,
                 actor_log=launcher.logs.get("actor"))
    return out, setup


async def startup_phases(cfg, endpoint: str) -> list[tuple[str, float]]:
    """The actor's start-up phases, in order (its LifecycleService.Describe)."""
    life = LifecycleClient(endpoint, timeout_s=60, security=security(cfg, "actor"))
    try:
        return (await life.describe())["startup"]
    finally:
        await life.close()


def startup_table(phases: list[tuple[str, float]], services_start_s: float) -> list[str]:
    """Markdown rows: each phase's seconds and share of the services' start, then the rest."""
    lines = [f"actor start-up, services up in {services_start_s:.1f} s:", "| phase | s | share |", "| --- | ---: | ---: |"]
    lines += [f"| {name} | {t:.2f} | {t / services_start_s:.0%} |" for name, t in phases]
    rest = services_start_s - sum(t for _, t in phases)
    return lines + [f"| rest: gRPC server up, the controller's connect | {rest:.1f} | {rest / services_start_s:.0%} |"]


def step_line(step: int, m: dict) -> str:
    phases = ", ".join(f"{p} {m[f'timing_s/{p}']:.1f}" for p in PHASES if f"timing_s/{p}" in m)
    return (f"step {step}: {m['timing_s/step']:.1f} s ({phases}); GPU peak allocated "
            f"{m.get('perf/max_memory_allocated_gb', 0):.1f} GiB, reserved {m.get('perf/max_memory_reserved_gb', 0):.1f}"
            f" GiB; actor RSS {m.get('perf/cpu_memory_used_gb', 0):.1f} GiB; host peak: services "
            f"{m['host_services_peak_gb']:.1f} GiB, machine {m['host_machine_peak_gb']:.1f} GiB; "
            f"response_length/mean {m.get('response_length/mean', 0):.0f}")


def preflight(a) -> bool:
    """megatron's CPU optimizer offload on this GPU at the tiny shape first (a GRPO step through the
    actor, bench/offload.py's `all+cpu_adam`, ~30 s): a failure costs that, not the 7B run."""
    tiny = os.path.join(tempfile.gettempdir(), "tandem-qwen-tiny")
    make_checkpoint(tiny, "tiny")
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "offload.py"),
           "--out", os.path.join(a.out, "preflight"), "--shape", "tiny", f"--checkpoint={tiny}", "--prompts", "4",
           "--n", "2", "--new-tokens", "8", "--warmup", "1", "--steps", "1", "--one", "all+cpu_adam"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    if proc.returncode != 0:
        print(f"preflight failed: the CPU optimizer offload does not run here (rc {proc.returncode}); no 7B run.\n"
              f"{proc.stderr[-6000:]}\nrerun with --fraction 0 to try without it (at 7B the training phase then "
              "needs the whole optimizer on the GPU)", flush=True)
        return False
    print(f"preflight: a tiny GRPO step with the CPU optimizer offload ran on this GPU ({time.perf_counter() - t:.0f} s)",
          flush=True)
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="7b", choices=["7b", "1.5b", "tiny"])
    p.add_argument("--checkpoint", help="checkpoint directory (default: made under the temp dir)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--mini", type=int, help="ppo_mini_batch_size in prompts (default: half the batch)")
    p.add_argument("--micro", type=int, help="rows per training forward/backward (default: the config's token budget)")
    p.add_argument("--fraction", type=float, help="share of Adam on the CPU (GPU runs; default: the config's)")
    p.add_argument("--threads", type=int, help="actor torch threads (the CPU Adam uses them; default: the config's)")
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--no-preflight", action="store_true", help="skip the tiny CPU-optimizer-offload check")
    p.add_argument("--no-offload", action="store_true", help="no offload settings (a baseline; does not fit at 7B)")
    p.add_argument("--out", required=True, help="directory for grpo_7b.json (after every step) and grpo_7b.md")
    p.add_argument("keys", nargs="*", metavar="KEY=VALUE", help="config keys on top of the bench's (e.g. a "
                   "reference token budget to compare, actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=8192)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    a.mini = a.mini or max(1, a.prompts // 2)
    a.checkpoint = a.checkpoint or os.path.join(tempfile.gettempdir(), f"tandem-qwen-{a.shape}")
    cuda = torch.cuda.is_available()
    configure_logging(role="controller", level="WARNING")
    t0 = time.perf_counter()
    config, keys = overrides(a, cuda)
    keys += a.keys
    info = make_checkpoint(a.checkpoint, a.shape)  # first: the config checks that the model path holds one
    if cuda and cpu_adam_fraction(config, keys) > 0 and not a.no_preflight and not preflight(a):
        return 2
    checkpoint_s = time.perf_counter() - t0
    print(f"checkpoint {info['path']}: {info['bytes'] / 1e9:.1f} GB, "
          f"{'kept' if info['kept'] else 'written'} in {time.perf_counter() - t0:.1f} s", flush=True)
    tmp = tempfile.mkdtemp(prefix="tandem-grpo7b-")
    cfg, run_dir = create_run_dir(load_config(config, [f"trainer.default_local_dir={tmp}",
                                                       "trainer.experiment_name=grpo_7b", *keys]))
    print(f"run directory {run_dir}; config {config}; overrides: {' '.join(keys)}", flush=True)
    out_json = os.path.join(a.out, "grpo_7b.json")
    steps, setup = asyncio.run(run_steps(cfg, run_dir, a.steps, out_json))
    with open(out_json, "w") as f:
        json.dump({"steps": steps, "setup": {k: v for k, v in setup.items()}, "config": config, "overrides": keys,
                   "checkpoint_s": checkpoint_s, "wall_s": time.perf_counter() - t0}, f, indent=1)
    gpu = torch.cuda.get_device_name() if cuda else "no GPU"
    print(f"\nmachine: {gpu}, {os.cpu_count()} CPUs, {psutil.virtual_memory().total / GIB:.0f} GiB host memory, "
          f"torch {torch.__version__}, Python {platform.python_version()}")
    wall = time.perf_counter() - t0
    print(f"wall {wall:.0f} s: {wall - sum(m['timing_s/step'] for m in steps):.0f} s outside the steps (checkpoint, "
          f"services up in {setup['services_start_s']:.0f} s: the actor's start-up below), then the steps")
    if len(steps) > 1:  # the bound: the first step within 2x a steady one (median of steps 2..N)
        steady = statistics.median(m["timing_s/step"] for m in steps[1:])
        print(f"first step {steps[0]['timing_s/step']:.1f} s = {steps[0]['timing_s/step'] / steady:.2f}x the steady "
              f"step ({steady:.1f} s)")
    startup_rows = startup_table(setup["actor_startup"], setup["services_start_s"])
    print("\n".join(startup_rows), flush=True)
    lines = ["| step | s | " + " | ".join(f"{p} s" for p in PHASES) + " | GPU peak alloc GiB | GPU peak reserved GiB "
             "| actor RSS GiB | host peak (services) GiB | host peak (machine) GiB |",
             "| ---: | ---: | " + " | ".join("---:" for _ in PHASES) + " | ---: | ---: | ---: | ---: | ---: |"]
    for i, m in enumerate(steps, 1):
        lines.append(f"| {i} | {m['timing_s/step']:.1f} | "
                     + " | ".join(f"{m.get(f'timing_s/{p}', 0):.1f}" for p in PHASES)
                     + f" | {m.get('perf/max_memory_allocated_gb', 0):.1f} | {m.get('perf/max_memory_reserved_gb', 0):.1f}"
                     f" | {m.get('perf/cpu_memory_used_gb', 0):.1f} | {m['host_services_peak_gb']:.1f}"
                     f" | {m['host_machine_peak_gb']:.1f} |")
    print("\n".join(lines), flush=True)
    with open(os.path.join(a.out, "grpo_7b.md"), "w") as f:
        f.write("\n".join(lines + [""] + startup_rows) + "\n")
    return 0 if len(steps) == a.steps else 1


if __name__ == "__main__":
    sys.exit(main())
