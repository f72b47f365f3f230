"""Peak GPU memory and step time of a colocated GRPO step with each offload key off and on.

    python bench/offload.py [--shape 1.5b] [--variants off,param,grad,optimizer,ref,kv,all,all+cpu_adam]
                            [--warmup 2] [--steps 2] [--prompts 32] [--n 8] [--new-tokens 512] [--prompt-len 64]
    python bench/offload.py --shape tiny --prompts 4 --n 2 --new-tokens 8 --warmup 1 --steps 1   # CPU smoke

One step is what a colocated GRPO step does in the actor process, through the service's own code
(ActorFront over one rank, the colocated rollout of services/actor/hybrid.py, the actor's memory
phases): generate n samples per prompt on the policy, old log-probs, reference log-probs (KL loss
on: the reference is live), the PPO update (random group-normalised rewards as advantages). The
model is a random-init Qwen2.5-shaped checkpoint (bench/make_checkpoint.py, bf16 on a GPU, fp32 on
CPU). Each variant runs in its own process (its own peaks, no compiled code or memory carried over):
`--warmup` untimed steps (compilation, graph capture, the first pinned host buffers: the second
step is the first with Adam state to move), then `--steps` timed ones. Variants:

  off           no offload (the baseline of every ratio)
  param, grad, optimizer, ref, kv
                one key on: actor.megatron.param_offload / grad_offload / optimizer_offload,
                ref.megatron.param_offload, rollout.free_cache_engine
  all           the four offload keys and free_cache_engine ("full offload")
  all+cpu_adam  all, plus megatron's CPU optimizer offload (HybridDeviceOptimizer, fraction 1;
                needs CUDA, the distributed optimizer and bf16)

Per variant: step seconds; the step's peak GPU memory allocated (perf/max_memory_allocated_gb of
the update, peaks reset at the step's start); the GPU memory held when generation starts (after
the phase change, before the KV cache: what offload frees for generation); the process's peak host
RSS; and what the actor's phases hold off the device at generation start (stashed bytes plus dropped
gradient buffers: the bookkeeping, which a CPU run shows too). "Training state" = what the off variant holds at generation start beyond the policy's own
weights (fp32 main weights, Adam moments, fp32 gradients, the reference): the share of it a variant
frees is (held_off - held_variant) / training_state. Goals (issue 19, 1.5B): `all` at most 1.3x
the step time of `off`, and frees at least 60% of the training state.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.make_checkpoint import make_checkpoint  # noqa: E402

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
KEYS = {"param": f"{A}.megatron.param_offload=true", "grad": f"{A}.megatron.grad_offload=true",
        "optimizer": f"{A}.megatron.optimizer_offload=true", "ref": f"{R}.megatron.param_offload=true",
        "kv": "actor_rollout_ref.rollout.free_cache_engine=true"}
CPU_ADAM = [f"{A}.megatron.use_distributed_optimizer=true",
            f"{A}.optim.override_optimizer_config.optimizer_cpu_offload=true",
            f"{A}.optim.override_optimizer_config.optimizer_offload_fraction=1.0",
            f"{A}.optim.override_optimizer_config.use_precision_aware_optimizer=true",
            f"{A}.optim.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d=true"]
VARIANTS = {"off": [], **{k: [v] for k, v in KEYS.items()}, "all": list(KEYS.values()),
            "all+cpu_adam": list(KEYS.values()) + CPU_ADAM}
GIB = 1024 ** 3


def config(args, variant: str):
    from tandem.config import load_config

    cuda = torch.cuda.is_available()
    return load_config(None, [
        f"actor_rollout_ref.model.path={args.checkpoint}", f"{A}.megatron.dtype={'bfloat16' if cuda else 'float32'}",
        f"data.train_batch_size={args.prompts}", f"actor_rollout_ref.rollout.n={args.n}",
        f"data.max_prompt_length={args.prompt_len}", f"data.max_response_length={args.new_tokens}",
        f"{A}.ppo_mini_batch_size={args.mini}", f"{A}.ppo_micro_batch_size_per_gpu={args.micro}",
        f"{R}.log_prob_micro_batch_size_per_gpu={args.micro}", f"{A}.use_kl_loss=true",
        f"{A}.optim.lr=1e-6", f"actor_rollout_ref.rollout.max_batch_size={args.prompts * args.n}",
        "trainer.sft.total_steps=0", *VARIANTS[variant]])


def grpo_advantages(rows: int, n: int, mask: torch.Tensor, seed: int) -> torch.Tensor:
    """Random 0/1 rewards, normalised within each prompt's n samples, on every response token."""
    from tandem.algos.advantages import compute_advantage

    scores = (torch.rand(rows, generator=torch.Generator().manual_seed(seed)) > 0.5).float()
    token_scores = torch.zeros_like(mask, dtype=torch.float32)
    last = mask.sum(1).clamp(min=1) - 1
    token_scores[torch.arange(rows), last] = scores
    adv, _ = compute_advantage("grpo", token_level_rewards=token_scores, response_mask=mask.float(),
                               index=torch.arange(rows) // n)
    return adv


def run_variant(args, variant: str) -> dict:
    """In this process: build the actor, run the steps -> the variant's figures."""
    from transformers import AutoTokenizer

    from services.actor import hybrid
    from services.actor.front import ActorFront
    from tandem.data.batch import DataProto
    from tandem.generation.sampling import SamplingParams
    from tandem.parallel import device
    from tandem.parallel.layout import ParallelConfig, init_distributed

    cfg = config(args, variant)
    rdzv = os.path.join(tempfile.mkdtemp(prefix="tandem-offload-"), "rdzv")
    init_distributed(ParallelConfig(), rank=0, world_size=1, init_method=f"file://{rdzv}", seed=1)
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    t0 = time.perf_counter()
    front = ActorFront.in_process(cfg, len(tokenizer))
    r = cfg.actor_rollout_ref.rollout
    rollout = hybrid.colocated_rollout_worker(front.local, tokenizer, r.max_batch_size, r.free_cache_engine)
    build_s = time.perf_counter() - t0
    policy_bytes = sum(p.numel() * p.element_size() for p in front.local.policy.parameters())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(16, len(tokenizer), (args.prompts, args.prompt_len), generator=g)
    prompts = DataProto(tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    steps = []
    for step in range(args.warmup + args.steps):
        device.synchronize()
        device.reset_memory_peaks()
        t = time.perf_counter()
        front.local.memory.enter("generate")  # what the generation's own phase change does first
        held_at_generation = device.memory_allocated()
        offloaded = offloaded_bytes(front.local)
        gen = rollout.generate_sequences(prompts, SamplingParams(max_new_tokens=args.new_tokens, n=args.n,
                                                                 temperature=1.0, seed=step))
        seq = gen.select(tensor_keys=["input_ids", "attention_mask", "responses", "response_mask"])
        seq.meta = {"temperature": 1.0, "rollout_n": args.n}
        batch = seq.union(front.compute_log_prob(seq)).union(front.compute_ref_log_prob(seq))
        batch.tensors["advantages"] = grpo_advantages(len(seq), args.n, seq["response_mask"], step)
        metrics = front.update_actor(batch)
        device.synchronize()
        steps.append({"step_s": time.perf_counter() - t, "held_at_generation_gb": held_at_generation / GIB,
                      "offloaded_at_generation_gb": offloaded / GIB,
                      "peak_allocated_gb": metrics["perf/max_memory_allocated_gb"],
                      "peak_reserved_gb": metrics["perf/max_memory_reserved_gb"],
                      "response_tokens": int(seq["response_mask"].sum())})
    timed = steps[args.warmup:]
    return {"variant": variant, "build_s": build_s, "policy_gb": policy_bytes / GIB, "steps": steps,
            "step_s": sum(s["step_s"] for s in timed) / len(timed),
            "peak_allocated_gb": max(s["peak_allocated_gb"] for s in timed),
            "peak_reserved_gb": max(s["peak_reserved_gb"] for s in timed),
            "held_at_generation_gb": max(s["held_at_generation_gb"] for s in timed),
            "offloaded_at_generation_gb": max(s["offloaded_at_generation_gb"] for s in timed),
            "host_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB}


def offloaded_bytes(actor) -> int:
    """What the actor's phases hold off the device now: stashed bytes, plus dropped gradient buffers."""
    memory = actor.memory
    out = sum(g.stash.nbytes_on_host for g in memory.groups.values() if g.stash is not None)
    if memory.where()["grads"] == "host":
        out += sum(b.grad_data.numel() * b.grad_data.element_size() for b in actor.ddp.buffers)
    return out


def ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}x" if base > 0 else "n/a"


def report(results: list[dict], args) -> None:
    base = next(r for r in results if r["variant"] == "off")
    state = base["held_at_generation_gb"] - base["policy_gb"]
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    import megatron.core

    print(f"\n### bench/offload.py: {args.shape} shape, {args.prompts} prompts x {args.n} x {args.new_tokens} "
          f"new tokens, {args.warmup} warm-up + {args.steps} timed step(s) per variant\n")
    print(f"- machine: {gpu}, torch {torch.__version__}, megatron-core {megatron.core.__version__}, "
          f"Python {platform.python_version()}")
    print(f"- policy weights {base['policy_gb']:.2f} GiB; training state held outside training with no offload "
          f"{state:.2f} GiB\n")
    print("| variant | step s | vs off | peak GPU alloc GiB | vs off | peak reserved GiB | GPU held at generation GiB "
          "| training state freed | off the device at generation GiB | host peak GiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        freed = f"{(base['held_at_generation_gb'] - r['held_at_generation_gb']) / state:.0%}" if state > 0 else "n/a"
        print(f"| {r['variant']} | {r['step_s']:.2f} | {ratio(r['step_s'], base['step_s'])} | "
              f"{r['peak_allocated_gb']:.2f} | {ratio(r['peak_allocated_gb'], base['peak_allocated_gb'])} | "
              f"{r['peak_reserved_gb']:.2f} | {r['held_at_generation_gb']:.2f} | {freed} | "
              f"{r['offloaded_at_generation_gb']:.3f} | {r['host_peak_gb']:.2f} |")
    full = next((r for r in results if r["variant"] == "all"), None)
    if full is not None and state > 0:
        freed = (base["held_at_generation_gb"] - full["held_at_generation_gb"]) / state
        print(f"\nfull offload (all): {full['step_s'] / base['step_s']:.2f}x the step time of off (goal <= 1.3), "
              f"frees {freed:.0%} of the training state outside training (goal >= 60%)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="1.5b", choices=["1.5b", "tiny", "7b"])
    p.add_argument("--checkpoint", help="a checkpoint directory (default: made under the temp dir)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant")
    p.add_argument("--steps", type=int, default=2, help="timed steps per variant")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--mini", type=int, help="ppo_mini_batch_size, prompts per optimizer step (default: a quarter)")
    p.add_argument("--micro", type=int, default=16, help="rows per forward/backward")
    p.add_argument("--one", help=argparse.SUPPRESS)  # run one variant in this process, JSON to --json
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.mini = args.mini or max(1, args.prompts // 4)
    args.checkpoint = args.checkpoint or os.path.join(tempfile.gettempdir(), f"tandem-qwen-{args.shape}")
    if args.one:
        with open(args.json, "w") as f:
            json.dump(run_variant(args, args.one), f)
        return
    info = make_checkpoint(args.checkpoint, args.shape)
    how = "kept" if info["kept"] else f"written in {info['seconds']:.1f} s"
    print(f"checkpoint {info['path']} ({info['bytes'] / 1e9:.2f} GB, {how})", flush=True)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or "off" not in variants:
        sys.exit(f"--variants: unknown {unknown} (known: {list(VARIANTS)}); 'off' is the baseline and must be in")
    if not torch.cuda.is_available() and "all+cpu_adam" in variants:
        variants.remove("all+cpu_adam")  # megatron's CPU optimizer offload needs CUDA
        print("all+cpu_adam skipped: no CUDA", flush=True)
    results = []
    passthrough = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                   ("shape", "checkpoint", "warmup", "steps", "prompts", "n", "new_tokens", "prompt_len", "mini", "micro")]
    for v in variants:
        out = os.path.join(tempfile.mkdtemp(prefix="tandem-offload-"), "result.json")
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, *passthrough, "--one", v, "--json", out],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"variant {v} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}", flush=True)
            continue
        with open(out) as f:
            results.append(json.load(f))
        print(f"{v}: {results[-1]['step_s']:.2f} s/step, peak {results[-1]['peak_allocated_gb']:.2f} GiB "
              f"({time.perf_counter() - t:.0f} s with start-up)", flush=True)
    if any(r["variant"] == "off" for r in results):
        report(results, args)


if __name__ == "__main__":
    main()
