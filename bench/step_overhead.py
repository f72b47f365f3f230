"""Share of a GRPO step spent in gRPC and the codec: the same step, served vs in-process.

One run, one machine:

  gRPC     the real services (actor, colocated: it also serves RolloutService; reward),
           started by the controller's local launcher as `tandem run` starts them, driven through
           controller.step.ppo_step with the real clients;
  inproc   the same workers built in this process (ActorWorker, a RolloutWorker on the
           actor's policy, RewardWorker), behind small async adapters with the clients'
           method names, driven through the same ppo_step.

Both see the same prompts and seeds step for step and start from the same weights (the
same seed), so they do the same work; in-process model work runs on a WorkerThread as in
the services (--on-loop: on the event loop's thread); blocks alternate (gRPC, inproc, gRPC, ...) to
cancel drift, after one untimed warm-up step each. overhead share = 1 - t_inproc / t_grpc.

Codec: every DataProto the clients encode or decode during the timed gRPC steps is
recorded, and its full trip is re-timed here: encode_batch + SerializeToString on the
sender, FromString + decode_batch on the receiver (both sides of each wire crossing;
the services' side happens in their process, so it is re-timed here, median of 5).

    python bench/step_overhead.py [--blocks 5] [--steps 4] [--on-loop] [key=value ...]

Defaults: the built-in config with trainer.sft.total_steps=0; overrides are dotted keys
as for `tandem run` (only the colocated GRPO roles, actor + reward, are supported).
Prints a markdown section for bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time

import google.protobuf
import grpc
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from controller.data import Cursor, collate, load_examples  # noqa: E402
from controller.launchers import LaunchContext, endpoints  # noqa: E402
from controller.launchers.local import LocalLauncher  # noqa: E402
from controller.roles import Roles, connect, needed_roles  # noqa: E402
from controller.run_dir import create_run_dir  # noqa: E402
from controller.step import StepContext, ppo_step  # noqa: E402
from tandem.algos.kl import get_kl_controller  # noqa: E402
from tandem.config import load_config  # noqa: E402
from tandem.data import codec  # noqa: E402
from tandem.data.batch import DataProto  # noqa: E402
from tandem.generation.sampling import SamplingParams  # noqa: E402
from tandem.logging import configure_logging  # noqa: E402
from tandem.v1 import data_pb2  # noqa: E402

PHASES = ["gen", "reward_logprob_values", "adv", "update_actor_critic"]
CHECK_KEYS = ["critic/score/mean", "response_length/mean", "actor/pg_loss"]


# ---- in-process adapters: the clients' method names, the workers called directly ----------

async def _direct(fn, *args, **kwargs):
    return fn(*args, **kwargs)


class InprocActor:
    def __init__(self, worker, run):
        self.w, self.run = worker, run

    async def compute_log_prob(self, batch: DataProto, calculate_entropy=False) -> DataProto:
        return await self.run(self.w.compute_log_prob, batch, calculate_entropy)

    async def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        return await self.run(self.w.compute_ref_log_prob, batch)

    async def update_actor(self, batch: DataProto) -> tuple[dict, int]:
        metrics = await self.run(self.w.update_actor, batch)
        return metrics, self.w.weights_version


class InprocRollout:
    def __init__(self, worker, run):
        self.w, self.run = worker, run

    async def generate_sequences(self, batch: DataProto, *, max_new_tokens: int, n: int = 1,
                                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1,
                                 seed: int | None = None, greedy: bool = False) -> DataProto:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                top_k=max(0, top_k), n=n, seed=seed, greedy=greedy)
        params.validate(self.w.vocab_size)
        return await self.run(self.w.generate_sequences, batch, params)


class InprocReward:
    def __init__(self, worker, run):
        self.w, self.run = worker, run

    async def score(self, batch: DataProto) -> list[float]:
        kw = {k: batch.columns[k] for k in ("response_text", "ground_truth", "data_source", "extra_info",
                                            "prompt_text") if k in batch.columns}
        return await self.run(self.w.score, **kw)


def build_inproc(cfg, tokenizer, on_loop: bool = False) -> Roles:
    """The workers, each behind an adapter. As in the services, model work runs on a
    WorkerThread (actor and rollout share one, as in the hybrid engine; reward has its own);
    on_loop=True calls them on the event loop's thread instead."""
    from services.actor.front import ActorFront
    from services.reward.worker import RewardWorker
    from tandem.parallel.layout import ParallelConfig, init_distributed
    from tandem.rollout.worker import RolloutWorker
    from tandem.serving.worker_thread import WorkerThread

    torch.set_num_threads(max(1, cfg.services.actor.torch_threads))  # as the actor service
    init_distributed(ParallelConfig(), rank=0, world_size=1,
                     seed=cfg.actor_rollout_ref.actor.megatron.seed)  # same seed: same initial weights
    actor = ActorFront.in_process(cfg, len(tokenizer))  # the service's front door, one rank
    rollout = RolloutWorker(actor.local.policy, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                            vocab_size=actor.vocab_size, max_batch_size=cfg.actor_rollout_ref.rollout.max_batch_size)
    reward = RewardWorker(default_rule=cfg.reward_model.default_rule)
    model_run = _direct if on_loop else WorkerThread("inproc-actor").run
    reward_run = _direct if on_loop else WorkerThread("inproc-reward").run
    return Roles(actor=InprocActor(actor, model_run), rollout=InprocRollout(rollout, model_run),
                 reward=InprocReward(reward, reward_run))


# ---- codec capture and re-timing ------------------------------------------------------------

class CodecRecorder:
    """Wraps codec.encode_batch / decode_batch (what the clients call) to keep each batch."""

    def __init__(self):
        self.batches: list[DataProto] = []
        self.on = False
        self._enc, self._dec = codec.encode_batch, codec.decode_batch

        def enc(batch):
            if self.on:
                self.batches.append(batch)
            return self._enc(batch)

        def dec(pb):
            out = self._dec(pb)
            if self.on:
                self.batches.append(out)
            return out
        codec.encode_batch, codec.decode_batch = enc, dec

    def restore(self):
        codec.encode_batch, codec.decode_batch = self._enc, self._dec


def codec_trip_s(batch: DataProto, repeats: int = 5) -> tuple[float, int]:
    """Median seconds of sender (encode + serialize) + receiver (parse + decode); wire bytes."""
    enc, dec = codec.encode_batch, codec.decode_batch
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        wire = enc(batch).SerializeToString()
        dec(data_pb2.Batch.FromString(wire))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(wire)


# ---- the measurement ------------------------------------------------------------------------

async def run_step(ctx: StepContext, prompts, step: int, grpc: bool):
    if grpc:
        ctx.roles.set_step(step)
    t0 = time.perf_counter()
    m = await ppo_step(ctx, prompts, step)
    return time.perf_counter() - t0, m


async def measure(cfg, run_dir, blocks: int, steps: int, on_loop: bool) -> dict:
    from transformers import AutoTokenizer

    run_id = os.path.basename(run_dir)
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.tokenizer_path)
    d = cfg.data
    train = load_examples(d.train_files, tokenizer, d.max_prompt_length)
    cursor = Cursor(len(train), seed=d.seed, shuffle=d.shuffle)
    prompts = [collate([train[i] for i in cursor.next(d.train_batch_size)], tokenizer.pad_token_id)
               for _ in range(1 + blocks * steps)]

    roles = needed_roles(cfg)
    if set(roles) != {"actor", "reward"}:
        raise SystemExit(f"step_overhead: only the colocated GRPO roles (actor, reward) are supported; "
                         f"this config needs {roles}")
    s, k = cfg.services, cfg.algorithm.kl_ctrl
    launcher = LocalLauncher(LaunchContext(os.path.join(run_dir, "config.yaml"), run_dir, run_id,
                                           s.startup_timeout_s))
    started = asyncio.create_task(endpoints(launcher, roles, {r: getattr(s, r).endpoint for r in roles}))
    await asyncio.sleep(0)  # start() spawns the services before its first wait
    grpc_roles = None
    recorder = CodecRecorder()
    try:
        t0 = time.perf_counter()
        inproc = build_inproc(cfg, tokenizer, on_loop)  # while the services start
        t_build = time.perf_counter() - t0
        grpc_roles = await connect(cfg, await started, run_id)
        modes = {m: StepContext(r, cfg, tokenizer, get_kl_controller(k.type, k.kl_coef, k.target_kl, k.horizon))
                 for m, r in (("grpc", grpc_roles), ("inproc", inproc))}
        times = {m: [] for m in modes}
        metrics = {m: [] for m in modes}
        for m, ctx in modes.items():  # warm-up: prompts[0], step 0
            await run_step(ctx, prompts[0], 0, m == "grpc")
        for b in range(blocks):
            for m, ctx in modes.items():
                recorder.on = m == "grpc"
                for j in range(steps):
                    i = 1 + b * steps + j
                    dt, met = await run_step(ctx, prompts[i], i, m == "grpc")
                    times[m].append(dt)
                    metrics[m].append(met)
                recorder.on = False
        recorder.restore()
        trips = [codec_trip_s(bt) for bt in recorder.batches]
    finally:
        recorder.restore()
        started.cancel()  # still waiting if something above failed first
        if grpc_roles is not None:
            await grpc_roles.close()
        launcher.stop()
    return {"times": times, "metrics": metrics, "trips": trips, "t_build": t_build,
            "rows": len(prompts[0]) * cfg.actor_rollout_ref.rollout.n}


def machine() -> str:
    u = platform.uname()
    return (f"{u.machine}, nproc {os.cpu_count()}, python {platform.python_version()}, torch {torch.__version__}, "
            f"protobuf {google.protobuf.__version__}, grpcio {grpc.__version__}, "
            f"loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())} at start")


def report(res: dict, cfg, overrides: list[str], blocks: int, steps: int, argv: list[str], started: str,
           load_start: str, on_loop: bool) -> str:
    tg, ti = res["times"]["grpc"], res["times"]["inproc"]
    mg, mi = statistics.mean(tg), statistics.mean(ti)
    n = len(tg)
    codec_s = sum(t for t, _ in res["trips"]) / n
    wire = sum(b for _, b in res["trips"]) / n
    a = cfg.actor_rollout_ref
    ph = {m: {p: statistics.mean(x[f"timing_s/{p}"] for x in res["metrics"][m]) for p in PHASES}
          for m in ("grpc", "inproc")}
    same = {k: max(abs(x.get(k, 0.0) - y.get(k, 0.0)) for x, y in zip(res["metrics"]["grpc"], res["metrics"]["inproc"]))
            for k in CHECK_KEYS}
    diffs = [statistics.mean(tg[i:i + steps]) - statistics.mean(ti[i:i + steps]) for i in range(0, n, steps)]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    blk = lambda ts: ", ".join(f"{statistics.mean(ts[i:i + steps]):.3f}" for i in range(0, len(ts), steps))  # noqa: E731
    lines = [
        "## step overhead (gRPC + codec share of a GRPO step)",
        "",
        f"- date: {started}",
        f"- command: `{shlex.join(['python', 'bench/step_overhead.py', *argv])}`",
        f"- machine: {load_start}; loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())} at end",
        f"- config: defaults + {shlex.join(overrides) or '(none)'}: {cfg.algorithm.adv_estimator}, "
        f"{cfg.data.train_batch_size} prompts x n={a.rollout.n} = {res['rows']} rows, "
        f"max_response_length {cfg.data.max_response_length}, model {a.model.num_hidden_layers}x{a.model.hidden_size}, "
        f"ppo_mini_batch_size {a.actor.ppo_mini_batch_size}, micro {a.actor.ppo_micro_batch_size_per_gpu}, "
        f"use_kl_loss {a.actor.use_kl_loss}, actor torch_threads {cfg.services.actor.torch_threads} (both modes)",
        f"- design: {blocks} blocks x {steps} steps per mode, alternating gRPC / inproc, 1 untimed warm-up step each; "
        f"same prompts, seeds and initial weights in both modes; in-process workers run "
        f"{'on the event loop thread (--on-loop)' if on_loop else 'on a WorkerThread, as in the services'}",
        "",
        "| | gRPC (services) | in-process | difference |",
        "| --- | ---: | ---: | ---: |",
        f"| mean step s ({n} steps) | {mg:.3f} | {mi:.3f} | {mg - mi:+.3f} |",
        f"| median step s | {statistics.median(tg):.3f} | {statistics.median(ti):.3f} | "
        f"{statistics.median(tg) - statistics.median(ti):+.3f} |",
    ]
    for p in PHASES:
        lines.append(f"| phase {p} s | {ph['grpc'][p]:.3f} | {ph['inproc'][p]:.3f} | {ph['grpc'][p] - ph['inproc'][p]:+.3f} |")
    lines += [
        f"| block means s | {blk(tg)} | {blk(ti)} | |",
        "",
        f"- overhead share (gRPC + codec + process boundary) = 1 - t_inproc/t_grpc = **{1 - mi / mg:.1%}** "
        f"({mg - mi:+.3f} s per step; +/- {se:.3f} s standard error from the {blocks} paired block differences); "
        f"from medians: "
        f"{1 - statistics.median(ti) / statistics.median(tg):.1%}",
        f"- codec (encode+serialize, parse+decode, both ends of each crossing): {codec_s * 1e3:.1f} ms per step "
        f"= **{codec_s / mg:.1%}** of the gRPC step ({len(res['trips']) // n} batches, "
        f"{wire / 1e6:.2f} MB on the wire per step)",
        f"- rest of the overhead (gRPC transport and protobuf message copies, servicer checks, two processes sharing the cores): "
        f"{(mg - mi - codec_s) * 1e3:+.1f} ms per step",
        f"- same work in both modes: max |difference| over steps of " +
        ", ".join(f"{k} {v:.2g}" for k, v in same.items()),
        f"- in-process workers built in {res['t_build']:.1f} s (not timed in the steps)",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, default=5, help="blocks per mode (alternating)")
    p.add_argument("--steps", type=int, default=4, help="timed steps per block")
    p.add_argument("--on-loop", action="store_true",
                   help="in-process: call the workers on the event loop's thread, not a WorkerThread")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, key=value")
    a = p.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_start = machine()
    configure_logging(role="controller", level="WARNING")
    tmp = tempfile.mkdtemp(prefix="tandem-step-overhead-")
    overrides = ["trainer.sft.total_steps=0", *a.overrides]
    cfg = load_config(None, [f"trainer.default_local_dir={tmp}", "trainer.experiment_name=step_overhead",
                             *overrides])
    try:
        cfg, run_dir = create_run_dir(cfg)
        res = asyncio.run(measure(cfg, run_dir, a.blocks, a.steps, a.on_loop))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(report(res, cfg, overrides, a.blocks, a.steps, argv, started, load_start, a.on_loop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
