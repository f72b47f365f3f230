"""Peak GPU memory and step time of a colocated GRPO step with each offload key off and on.

    python bench/offload.py --out DIR [--shape 1.5b] [--variants off,all,param,grad,optimizer,ref]
                            [--warmup 1] [--steps 2] [--prompts 32] [--n 8] [--new-tokens 512] [--prompt-len 64]
                            [--budget-s S] [--reuse]
    python bench/offload.py --out /tmp/offload --shape tiny --prompts 4 --n 2 --new-tokens 8 --steps 1  # CPU smoke

One step is what a colocated GRPO step does in the actor process, through the service's own code
(ActorFront over one rank, the colocated rollout of services/actor/hybrid.py, the actor's memory
phases): generate n samples per prompt on the policy, old log-probs, reference log-probs (KL loss
on: the reference is live), the PPO update (random group-normalised rewards as advantages). With
several mini-batches per step (the default, a quarter of the prompts each) the old log-probs are a
pass of their own, as the controller runs it; with `--mini` = `--prompts` the step is what the
controller's on-policy update does instead (UpdateActor on_policy: the update's forward gives them). The
model is a random-init Qwen2.5-shaped checkpoint (bench/make_checkpoint.py, bf16 on a GPU, fp32 on
CPU). Each variant runs in its own process (its own peaks, no compiled code or memory carried over):
`--warmup` untimed steps (compilation, graph capture), then one move of every group out and back
(the Adam state exists after the first update: this allocates its pinned host buffers, once per
process, outside the timed steps), then `--steps` timed ones. Variants (in this order, the goal's
two first: a variant that would overrun `--budget-s` is skipped and said so; on an H200 a variant
costs ~140-200 s, mostly start-up and compilation, so split the set over two device calls with the
same `--out` and `--reuse`):

  off           no offload (the baseline of every ratio)
  all           verl's four offload keys ("full offload"); the KV cache stays, as in off
  param, grad, optimizer, ref
                one key on: actor.megatron.param_offload / grad_offload / optimizer_offload,
                ref.megatron.param_offload
  kv            rollout.free_cache_engine (not by default)
  all+cpu_adam  all, plus megatron's CPU optimizer offload (HybridDeviceOptimizer, fraction 1;
                needs CUDA, the distributed optimizer and bf16; not by default)

Per variant: step seconds; the step's peak GPU memory allocated (perf/max_memory_allocated_gb of
the update, peaks reset at the step's start); the GPU memory allocated when generation starts (after
the phase change; the previous step's KV cache included, in every default variant alike); the
process's peak host RSS; and the training state on the device at generation start, counted from
the tensors (distinct storages of the policy, the reference, the gradient buffers and the optimizer
state: a CPU run shows this bookkeeping too). "Training state" = that count in `off` (everything
resident). The share a variant frees, the goal's figure, is measured by the allocator:
(allocated_off - allocated_variant) / training_state at generation start (on CPU, where the
allocator reads 0, the tensor count stands in, marked). Goals (issue 19, 1.5B): `all` at most 1.3x
the step time of `off`, and frees at least 60% of the training state. Results go to
OUT/offload.json (after every variant) and OUT/offload.md.
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
OFFLOAD = [v for k, v in KEYS.items() if k != "kv"]  # verl's four keys
VARIANTS = {"off": [], "all": OFFLOAD, **{k: [v] for k, v in KEYS.items()}, "all+cpu_adam": OFFLOAD + CPU_ADAM}
DEFAULT_VARIANTS = ("off", "all", "param", "grad", "optimizer", "ref")
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

    from tandem.data.batch import DataProto
    from tandem.generation.sampling import SamplingParams
    from tandem.parallel import device
    from tandem.parallel.layout import ParallelConfig, init_distributed
    from tandem.services.actor import hybrid
    from tandem.services.actor.front import ActorFront

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
    on_policy = args.mini >= args.prompts  # one mini-batch: the controller's on-policy update
    steps = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:  # every group out and back once: pinned host buffers exist before timing
            memory = front.local.memory
            memory.enter("generate")
            memory.enter("ref_log_probs")
            memory.enter("train")
        device.synchronize()
        device.reset_memory_peaks()
        t = time.perf_counter()
        front.local.memory.enter("generate")  # what the generation's own phase change does first
        held_at_generation = device.memory_allocated()
        state_on_device = resident_state_bytes(front.local)
        offloaded = offloaded_bytes(front.local)
        gen = rollout.generate_sequences(prompts, SamplingParams(max_new_tokens=args.new_tokens, n=args.n,
                                                                 temperature=1.0, seed=step))
        seq = gen.select(tensor_keys=["input_ids", "attention_mask", "responses", "response_mask"])
        seq.meta = {"temperature": 1.0, "rollout_n": args.n}
        # as the step: a pass before the update leaves it the rows it computes itself (on policy: all)
        batch = seq.union(front.log_probs(seq, with_reference=True, before_update=True)[0])
        batch.tensors["advantages"] = grpo_advantages(len(seq), args.n, seq["response_mask"], step)
        metrics = front.update_actor(batch).metrics
        device.synchronize()
        steps.append({"step_s": time.perf_counter() - t, "held_at_generation_gb": held_at_generation / GIB,
                      "state_on_device_gb": state_on_device / GIB, "offloaded_at_generation_gb": offloaded / GIB,
                      "peak_allocated_gb": metrics["perf/max_memory_allocated_gb"],
                      "peak_reserved_gb": metrics["perf/max_memory_reserved_gb"],
                      "response_tokens": int(seq["response_mask"].sum())})
    timed = steps[args.warmup:]
    return {"variant": variant, "build_s": build_s, "policy_gb": policy_bytes / GIB, "steps": steps,
            "step_s": sum(s["step_s"] for s in timed) / len(timed),
            "peak_allocated_gb": max(s["peak_allocated_gb"] for s in timed),
            "peak_reserved_gb": max(s["peak_reserved_gb"] for s in timed),
            "held_at_generation_gb": max(s["held_at_generation_gb"] for s in timed),
            "state_on_device_gb": max(s["state_on_device_gb"] for s in timed), "on_policy": on_policy,
            "offloaded_at_generation_gb": max(s["offloaded_at_generation_gb"] for s in timed),
            "host_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB}


def resident_state_bytes(actor) -> int:
    """The training state's bytes on the device now, from its tensors: each distinct storage of the
    policy, the reference, the gradient buffers and the optimizer state (a stashed or dropped one
    has 0 bytes; megatron's CPU optimizer share lives on the host)."""
    tensors = [*actor.policy.parameters(), *actor.ref.parameters(), *(b.grad_data for b in actor.ddp.buffers)]
    tensors += [t for o in (actor.optimizer, actor.sft_optimizer) if o is not None for t in o.state_tensors()]
    here = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    sizes = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors if t.device == here}
    return sum(sizes.values())


def offloaded_bytes(actor) -> int:
    """What the actor's phases hold off the device now: stashed bytes, plus dropped gradient buffers."""
    memory = actor.memory
    out = sum(g.stash.nbytes_on_host for g in memory.groups.values() if g.stash is not None)
    if memory.where()["grads"] == "host":
        out += sum(b.grad_data.numel() * b.grad_data.element_size() for b in actor.ddp.buffers)
    return out


def ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}x" if base > 0 else "n/a"


def freed_share(r: dict, base: dict) -> tuple[float, str]:
    """(share of the training state a variant frees at generation start, how it was measured)."""
    state = base["state_on_device_gb"]
    if base["held_at_generation_gb"] > 0:  # the allocator (a GPU)
        return (base["held_at_generation_gb"] - r["held_at_generation_gb"]) / state, "allocator"
    return (state - r["state_on_device_gb"]) / state, "tensors (CPU: no allocator figure)"


def report(results: list[dict], args) -> str:
    import megatron.core

    base = next(r for r in results if r["variant"] == "off")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    lines = [f"### bench/offload.py: {args.shape} shape, {args.prompts} prompts x {args.n} x {args.new_tokens} "
             f"new tokens, {args.warmup} warm-up + {args.steps} timed step(s) per variant"
             f"{' (on-policy update)' if base['on_policy'] else ''}", "",
             f"- machine: {gpu}, torch {torch.__version__}, megatron-core {megatron.core.__version__}, "
             f"Python {platform.python_version()}",
             f"- policy weights {base['policy_gb']:.2f} GiB; training state (policy, reference, gradient buffers, "
             f"optimizer state) {base['state_on_device_gb']:.2f} GiB, all on the device at generation with no offload",
             "", "| variant | step s | vs off | peak GPU alloc GiB | vs off | peak reserved GiB | GPU alloc at generation "
             "GiB | state on device at generation GiB | training state freed | host peak GiB |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    how = ""
    for r in results:
        share, how = freed_share(r, base)
        lines.append(f"| {r['variant']} | {r['step_s']:.2f} | {ratio(r['step_s'], base['step_s'])} | "
                     f"{r['peak_allocated_gb']:.2f} | {ratio(r['peak_allocated_gb'], base['peak_allocated_gb'])} | "
                     f"{r['peak_reserved_gb']:.2f} | {r['held_at_generation_gb']:.2f} | {r['state_on_device_gb']:.2f} | "
                     f"{share:.0%} | {r['host_peak_gb']:.2f} |")
    lines.append(f"\ntraining state freed: measured by the {how}")
    full = next((r for r in results if r["variant"] == "all"), None)
    if full is not None:
        share, _ = freed_share(full, base)
        lines.append(f"full offload (all): {full['step_s'] / base['step_s']:.2f}x the step time of off (goal <= 1.3), "
                     f"frees {share:.0%} of the training state at generation (goal >= 60%)")
    return "\n".join(lines) + "\n"


def run_in_subprocess(args, variant: str, timeout_s: float) -> dict | None:
    """One variant in a fresh process -> its figures (None: it failed or ran out of time, said why)."""
    out = os.path.join(args.out, f"{variant}.json")
    passthrough = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                   ("shape", "checkpoint", "warmup", "steps", "prompts", "n", "new_tokens", "prompt_len", "mini",
                    "micro", "out")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), *passthrough, "--one", variant],
                              capture_output=True, text=True, check=False, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-3000:]
        print(f"variant {variant}: no result within {timeout_s:.0f} s\n{tail.decode() if isinstance(tail, bytes) else tail}",
              flush=True)
        return None
    if proc.returncode != 0 or not os.path.isfile(out):
        print(f"variant {variant} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}", flush=True)
        return None
    with open(out) as f:
        return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for offload.json, offload.md and each variant's JSON")
    p.add_argument("--shape", default="1.5b", choices=["1.5b", "tiny", "7b"])
    p.add_argument("--checkpoint", help="a checkpoint directory (default: made under the temp dir)")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per variant")
    p.add_argument("--steps", type=int, default=2, help="timed steps per variant")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--mini", type=int, help="ppo_mini_batch_size, prompts per optimizer step (default: a quarter)")
    p.add_argument("--micro", type=int, default=16, help="rows per forward/backward")
    p.add_argument("--budget-s", type=float, default=0, help="start no variant that would end after this (0: no limit)")
    p.add_argument("--reuse", action="store_true", help="take a variant's figures from OUT/<variant>.json when there "
                   "(a set split over several calls: each variant costs ~140-200 s on an H200, mostly build and compile)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # run one variant in this process, JSON to OUT/<variant>.json
    args = p.parse_args()
    args.mini = args.mini or max(1, args.prompts // 4)
    args.checkpoint = args.checkpoint or os.path.join(tempfile.gettempdir(), f"tandem-qwen-{args.shape}")
    os.makedirs(args.out, exist_ok=True)
    if args.one:
        result = run_variant(args, args.one)
        with open(os.path.join(args.out, f"{args.one}.json"), "w") as f:
            json.dump(result, f)
        return
    t_start = time.perf_counter()
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
    variants.sort(key=lambda v: v != "off")  # the baseline first
    results, took = [], []
    for v in variants:
        if args.reuse and os.path.isfile(kept := os.path.join(args.out, f"{v}.json")):
            with open(kept) as f:
                results.append(json.load(f))
            print(f"variant {v}: figures reused from {kept}", flush=True)
            continue
        left = (args.budget_s or float("inf")) - (time.perf_counter() - t_start)
        expected = max(took[1:] or took or [0])  # the first variant also compiles what the others reuse
        if left < expected:
            print(f"variant {v}: skipped, {left:.0f} s of --budget-s left and a variant takes ~{expected:.0f} s", flush=True)
            continue
        t = time.perf_counter()
        r = run_in_subprocess(args, v, timeout_s=min(max(left, 60) + 60, 3600))
        took.append(time.perf_counter() - t)
        if r is None:
            continue
        results.append(r)
        print(f"{v}: {r['step_s']:.2f} s/step, peak {r['peak_allocated_gb']:.2f} GiB, GPU alloc at generation "
              f"{r['held_at_generation_gb']:.2f} GiB, state on device {r['state_on_device_gb']:.3f} GiB "
              f"({took[-1]:.0f} s with start-up)", flush=True)
        with open(os.path.join(args.out, "offload.json"), "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    if not any(r["variant"] == "off" for r in results):
        sys.exit("no baseline (off) result: no ratios")
    text = report(results, args)
    print("\n" + text, flush=True)
    with open(os.path.join(args.out, "offload.md"), "w") as f:
        f.write(text)
    print(f"wall {time.perf_counter() - t_start:.0f} s; results in {args.out}", flush=True)


if __name__ == "__main__":
    main()
