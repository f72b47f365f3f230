"""Activation memory per rank of one long row at context parallelism 1 and 2, with the step time.

    python bench/context_parallel.py [--tokens 8192] [--cps 1,2] [--repeat 2]

One row of --tokens tokens (a 64-token prompt, the rest response) through the actor's training
forward and backward (megatron DDP, Tandem's packed schedule and PPO loss) on a small model
(hidden 256, 4 layers, 4 heads / 2 query groups, fp32), once per CP size, each in its own
processes (gloo; on GPUs NCCL). Per rank it reports:

- saved for backward: the bytes autograd keeps between forward and backward (unique storages,
  counted with saved-tensor hooks), i.e. the activation memory that long rows run out of;
- peak RSS growth: the process's resident high-water mark during the step over its size just
  before it (CPU only; the allocator keeps some freed memory, so this is an upper bound);
- step time: the slowest rank's forward + backward, median of --repeat steps (the first is
  the measured-memory one, the others only time).

Prints a markdown table with each CP's figures as a ratio to CP=1 of the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = 64
SHAPE = ["actor_rollout_ref.model.hidden_size=256", "actor_rollout_ref.model.num_hidden_layers=4",
         "actor_rollout_ref.model.num_attention_heads=4", "actor_rollout_ref.model.num_key_value_heads=2",
         "actor_rollout_ref.model.intermediate_size=1024"]


def config(tok: str, cp: int, tokens: int):
    """The actor's config alone (the run-level checks want a whole run's layout)."""
    from omegaconf import OmegaConf

    from tandem.config import TandemConfig

    over = OmegaConf.from_dotlist(SHAPE + [
        f"actor_rollout_ref.model.max_position_embeddings={tokens}", f"actor_rollout_ref.model.tokenizer_path={tok}",
        "actor_rollout_ref.actor.megatron.dtype=float32", f"actor_rollout_ref.actor.megatron.context_parallel_size={cp}",
        f"services.actor.world_size={cp}", "actor_rollout_ref.actor.use_torch_compile=false"])
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TandemConfig), over))


def long_row(vocab: int, tokens: int):
    import torch

    from tandem.data.batch import DataProto

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (1, tokens), generator=g)
    resp = tokens - PROMPT
    return DataProto(tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids),
                              "responses": ids[:, PROMPT:].clone(), "response_mask": torch.ones(1, resp, dtype=torch.long),
                              "old_log_probs": torch.zeros(1, resp), "advantages": torch.randn(1, resp, generator=g)},
                     meta={"temperature": 1.0})


class SavedBytes:
    """Bytes of the unique storages autograd saves for backward while active, the model's own
    (parameters, their buffers) left out."""

    def __init__(self, model):
        import torch

        self.seen, self.total = {p.untyped_storage().data_ptr() for p in model.parameters()}, 0
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def pack(self, t):
        s = t.untyped_storage()
        if s.data_ptr() not in self.seen:
            self.seen.add(s.data_ptr())
            self.total += s.nbytes()
        return t


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def rank_main(rank: int, cp: int, rdzv: str, tok: str, tokens: int, repeat: int, out: str) -> None:
    import functools

    import torch
    from transformers import AutoTokenizer

    from tandem.parallel import device
    from tandem.parallel.layout import ParallelConfig, init_distributed
    from tandem.services.actor.worker import ActorWorker
    from tandem.train import losses
    from tandem.train.schedule import run_schedule

    os.environ["LOCAL_RANK"] = str(rank)
    tokenizer = AutoTokenizer.from_pretrained(tok)
    cfg = config(tok, cp, tokens)
    init_distributed(ParallelConfig(cp=cp), rank, cp, rdzv, seed=1)
    worker = ActorWorker(cfg, len(tokenizer))
    batch = long_row(len(tokenizer), tokens)
    loss_fn = functools.partial(losses.ppo_actor_loss, cfg=cfg.actor_rollout_ref.actor, temperature=1.0)
    worker.ddp.train()
    times, saved, grown = [], 0, 0
    for i in range(repeat):
        worker.ddp.zero_grad_buffer()
        torch.distributed.barrier()
        if not device.has_cuda():
            with open("/proc/self/clear_refs", "w") as f:  # resets the resident high-water mark
                f.write("5")
        before = _rss("VmRSS:") if not device.has_cuda() else torch.cuda.memory_allocated()
        if device.has_cuda():
            torch.cuda.reset_peak_memory_stats()
        counter = SavedBytes(worker.ddp)
        t0 = time.perf_counter()
        with counter.hooks:
            run_schedule(worker.ddp, [batch], loss_fn, forward_only=False)
        device.synchronize()
        times.append(time.perf_counter() - t0)
        if i == 0:
            saved = counter.total
            peak = _rss("VmHWM:") if not device.has_cuda() else torch.cuda.max_memory_allocated()
            grown = peak - before
    slowest = torch.tensor(times)
    torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"saved": saved, "grown": grown, "times": slowest.tolist()}, f)


def run(cp: int, tok: str, tokens: int, repeat: int, tmp: str) -> dict:
    from tandem.parallel.layout import local_tcp_rendezvous

    out = os.path.join(tmp, f"cp{cp}.json")
    rdzv = local_tcp_rendezvous()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--cp", str(cp), "--rdzv", rdzv,
                               "--tok", tok, "--tokens", str(tokens), "--repeat", str(repeat), "--out", out],
                              env=env, cwd=ROOT) for r in range(cp)]
    if any(p.wait() for p in procs):
        raise SystemExit(f"CP={cp}: a rank failed")
    with open(out) as f:
        return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--cps", default="1,2")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--rank", type=int)
    p.add_argument("--cp", type=int)
    p.add_argument("--rdzv")
    p.add_argument("--tok")
    p.add_argument("--out")
    a = p.parse_args()
    if a.rank is not None:
        rank_main(a.rank, a.cp, a.rdzv, a.tok, a.tokens, a.repeat, a.out)
        from tandem.process_exit import exit_process

        exit_process(0)
    from tandem.tasks.arithmetic import build_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tok = build_tokenizer(os.path.join(tmp, "tok"))
        res = {cp: run(cp, tok, a.tokens, a.repeat, tmp) for cp in (int(c) for c in a.cps.split(","))}
    base = res[min(res)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    print(f"\none row of {a.tokens} tokens, hidden 256 x 4 layers, fp32; commit {commit.strip()}, "
          f"{os.cpu_count()} CPUs\n")
    print("| CP | saved for backward per rank (MiB) | ratio | peak RSS growth per rank (MiB) | ratio "
          "| step time (s, median) | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for cp, r in res.items():
        t, bt = sorted(r["times"])[len(r["times"]) // 2], sorted(base["times"])[len(base["times"]) // 2]
        print(f"| {cp} | {r['saved'] / 2**20:.1f} | {r['saved'] / base['saved']:.2f} | {r['grown'] / 2**20:.1f} "
              f"| {r['grown'] / base['grown']:.2f} | {t:.2f} | {t / bt:.2f} |")


if __name__ == "__main__":
    main()
