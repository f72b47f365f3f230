"""The ways bench/step_overhead.py runs one GRPO step, each behind `await mode.step(i)`.

  GrpcMode      the real services (actor, colocated: it also serves RolloutService; reward),
                started by the controller's local launcher as `tandem run` starts them, driven
                through controller.step.ppo_step with the real clients; it can keep each step's
                update batch (what PureMode replays)
  InprocMode    the same workers built in this process (ActorFront over a one-rank group, a
                RolloutWorker on the actor's policy, RewardWorker) behind adapters with the
                clients' method names, through the same ppo_step
  BaselineMode  GrpcMode with the code of another checkout (e.g. the commit before a change), in
                a driver process of its own (this file run with --driver and that tree first on
                sys.path; its services get PYTHONPATH=tree), stepped over stdin / stdout
  PureMode      the update's arithmetic alone on GrpcMode's update batches, in a plain torch loop
                on the actor's model or with transformers (small_step.py)

Every mode sees the same prompts (prompts[i] at step i) and starts from the same weights (the
same seed or checkpoint), so they do the same work.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
import time

TREE = os.environ.get("TANDEM_BENCH_TREE") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.abspath(TREE))
from tandem.algos.kl import get_kl_controller  # noqa: E402
from tandem.controller.data import Cursor, collate, load_examples  # noqa: E402
from tandem.controller.launchers import LaunchContext, endpoints  # noqa: E402
from tandem.controller.launchers.local import LocalLauncher  # noqa: E402
from tandem.controller.roles import Roles, connect, needed_roles  # noqa: E402
from tandem.controller.step import StepContext, ppo_step  # noqa: E402
from tandem.data.batch import DataProto  # noqa: E402
from tandem.generation.sampling import SamplingParams  # noqa: E402


def load_prompts(cfg, tokenizer, count: int) -> list[DataProto]:
    """The run's first `count` batches of training prompts (its data cursor)."""
    d = cfg.data
    train = load_examples(d.train_files, tokenizer, d.max_prompt_length)
    cursor = Cursor(len(train), seed=d.seed, shuffle=d.shuffle)
    return [collate([train[i] for i in cursor.next(d.train_batch_size)], tokenizer.pad_token_id)
            for _ in range(count)]


def step_context(cfg, roles, tokenizer) -> StepContext:
    k = cfg.algorithm.kl_ctrl
    return StepContext(roles, cfg, tokenizer, get_kl_controller(k.type, k.kl_coef, k.target_kl, k.horizon))


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by this process and the services `pids` (with their
    children ranks): unlike wall time, it does not grow when other jobs take the cores."""
    import psutil

    total = sum(psutil.Process().cpu_times()[:2])  # this process alone (its children are services)
    for pid in pids:
        try:
            procs = [psutil.Process(pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            try:
                t = proc.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
    return total


async def timed_step(ctx: StepContext, prompts: DataProto, step: int, pids: list[int]) -> tuple[float, dict]:
    """-> (wall seconds, the step's metrics + "bench/cpu_s": CPU seconds of this process and the
    services `pids` during it)."""
    c0, t0 = cpu_seconds(pids), time.perf_counter()
    # a run's steps count from 1: step 0 would be a critic warm-up step (no actor update)
    metrics = await ppo_step(ctx, prompts, step + 1)
    dt = time.perf_counter() - t0
    return dt, {**metrics, "bench/cpu_s": cpu_seconds(pids) - c0}


# ---- the real services ------------------------------------------------------------------------

class GrpcMode:
    def __init__(self, cfg, run_dir: str, tokenizer, prompts: list[DataProto], record: bool = False):
        roles = needed_roles(cfg)
        if set(roles) != {"actor", "reward"}:
            raise SystemExit(f"step_overhead: only the colocated GRPO roles (actor, reward) are supported; "
                             f"this config needs {roles}")
        self.cfg, self.tokenizer, self.prompts, self.roles_needed = cfg, tokenizer, prompts, roles
        self.launcher = LocalLauncher(LaunchContext(os.path.join(run_dir, "config.yaml"), run_dir,
                                                    os.path.basename(run_dir), cfg.services.startup_timeout_s))
        self.run_id = os.path.basename(run_dir)
        self.roles: Roles | None = None
        self.started = None
        self.update_batches: dict[int, DataProto] = {} if record else None

    def start(self) -> None:
        """Spawn the services (call from the event loop; `connect` waits for them)."""
        s = self.cfg.services
        self.started = asyncio.create_task(endpoints(self.launcher, self.roles_needed,
                                                     {r: getattr(s, r).endpoint for r in self.roles_needed}))

    async def connect(self) -> None:
        extra = {"pad_id": self.tokenizer.pad_token_id} if "pad_id" in inspect.signature(connect).parameters else {}
        self.roles = await connect(self.cfg, await self.started, self.run_id, **extra)  # older trees: no pad_id
        self.ctx = step_context(self.cfg, self.roles, self.tokenizer)
        if self.update_batches is not None:
            self._record(self.roles.actor)

    def _record(self, actor) -> None:
        call = actor.update_actor

        async def recorded(rows, batch):
            if not isinstance(rows, DataProto):
                raise SystemExit("step_overhead --pure: the update's rows stay on the colocated actor (kept rows), "
                                 "so there is no update batch to replay here")
            self.update_batches[self.current] = DataProto(tensors={**rows.tensors, **batch.tensors}, meta=rows.meta)
            return await call(rows, batch)
        actor.update_actor = recorded

    async def step(self, i: int) -> tuple[float, dict]:
        self.current = i
        self.roles.set_step(i)
        return await timed_step(self.ctx, self.prompts[i], i, [p.pid for p in self.launcher.processes.values()])

    async def close(self) -> None:
        if self.started is not None:
            self.started.cancel()
        if self.roles is not None:
            await self.roles.close()
        self.launcher.stop()


# ---- the same workers in this process -----------------------------------------------------------

async def _direct(fn, *args, **kwargs):
    return fn(*args, **kwargs)


class InprocActor:
    def __init__(self, worker, run):
        self.w, self.run = worker, run

    async def compute_log_prob(self, rows: DataProto, calculate_entropy=False, with_reference=False,
                               before_update=False) -> tuple[DataProto, int]:
        return await self.run(self.w.log_probs, rows, calculate_entropy, with_reference, before_update)

    async def update_actor(self, rows: DataProto, batch: DataProto) -> tuple[dict, int, DataProto | None, int]:
        update = await self.run(self.w.update_actor, DataProto(tensors={**rows.tensors, **batch.tensors},
                                                                meta=rows.meta))
        return update.metrics, self.w.weights_version, update.old_log_probs, update.update_rows


class InprocRollout:
    def __init__(self, worker, run):
        self.w, self.run = worker, run

    async def generate_sequences(self, batch: DataProto, *, max_new_tokens: int, n: int = 1,
                                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1,
                                 seed: int | None = None, greedy: bool = False, keep=None) -> DataProto:
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

    async def score_rows(self, batch: DataProto) -> tuple[list[float], dict[int, str]]:
        """As RewardClient.score_rows: the built-in rules score every row (no failed rows)."""
        return await self.score(batch), {}


class InprocMode:
    """As in the services, model work runs on a WorkerThread (actor and rollout share one, as in
    the hybrid engine; reward has its own); on_loop=True calls them on the event loop's thread."""

    def __init__(self, cfg, tokenizer, prompts: list[DataProto], on_loop: bool = False):
        import torch

        from tandem.rollout.worker import RolloutWorker
        from tandem.services.actor.front import ActorFront
        from tandem.services.reward.worker import RewardWorker
        from tandem.serving.worker_thread import WorkerThread

        torch.set_num_threads(max(1, cfg.services.actor.torch_threads))  # as the actor service
        ensure_megatron(cfg)
        actor = ActorFront.in_process(cfg, len(tokenizer))  # the service's front door, one rank
        rollout = RolloutWorker(actor.local.policy, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                                vocab_size=actor.vocab_size,
                                max_batch_size=cfg.actor_rollout_ref.rollout.max_batch_size)
        reward = RewardWorker(default_rule=cfg.reward_model.default_rule)
        model_run = _direct if on_loop else WorkerThread("inproc-actor").run
        reward_run = _direct if on_loop else WorkerThread("inproc-reward").run
        roles = Roles(actor=InprocActor(actor, model_run), rollout=InprocRollout(rollout, model_run),
                      reward=InprocReward(reward, reward_run))
        self.ctx, self.prompts = step_context(cfg, roles, tokenizer), prompts

    async def step(self, i: int) -> tuple[float, dict]:
        return await timed_step(self.ctx, self.prompts[i], i, [])

    async def close(self) -> None:
        pass


# ---- another checkout's code, in a driver process ---------------------------------------------

class BaselineMode:
    def __init__(self, tree: str, overrides: list[str], count: int):
        env = dict(os.environ, TANDEM_BENCH_TREE=os.path.abspath(tree),
                   PYTHONPATH=os.pathsep.join([os.path.abspath(tree), os.environ.get("PYTHONPATH", "")]))
        # cwd: the services it starts run `python -m tandem.services...`, which puts the working
        # directory first on sys.path: from this checkout they would run this checkout's code
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--driver", str(count), *overrides],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
                                     cwd=os.path.abspath(tree))

    async def connect(self) -> None:
        line = await asyncio.to_thread(self.proc.stdout.readline)
        if line.strip() != "ready":
            raise RuntimeError(f"baseline driver did not start (said {line!r}; its stderr is above)")

    async def step(self, i: int) -> tuple[float, dict]:
        self.proc.stdin.write(f"{i}\n")
        self.proc.stdin.flush()
        line = await asyncio.to_thread(self.proc.stdout.readline)
        if not line:
            raise RuntimeError("baseline driver exited (its stderr is above)")
        dt, metrics = json.loads(line)
        return dt, metrics

    async def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            await asyncio.to_thread(self.proc.wait, 120)


def driver_main(count: int, overrides: list[str]) -> None:
    """--driver: GrpcMode in this tree for steps read from stdin, one JSON line [seconds, metrics] each."""
    from transformers import AutoTokenizer

    from tandem.config import load_config
    from tandem.controller.run_dir import create_run_dir
    from tandem.logging import configure_logging

    out = sys.stdout
    sys.stdout = sys.stderr  # only the protocol on stdout
    configure_logging(role="controller", level="WARNING")
    cfg, run_dir = create_run_dir(load_config(None, overrides))
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.tokenizer_path)

    async def serve():
        mode = GrpcMode(cfg, run_dir, tokenizer, load_prompts(cfg, tokenizer, count))
        mode.start()
        try:
            await mode.connect()
            print("ready", file=out, flush=True)
            for line in sys.stdin:
                dt, metrics = await mode.step(int(line))
                print(json.dumps([dt, {k: float(v) for k, v in metrics.items()}]), file=out, flush=True)
        finally:
            await mode.close()

    asyncio.run(serve())


# ---- the update's arithmetic alone ---------------------------------------------------------------

class PureMode:
    """kind "modules": small_step.ModulesUpdate (the actor's model, plain torch loop); "hf":
    small_step.HFUpdate (transformers, padded)."""

    def __init__(self, kind: str, hf_path: str, cfg, tokenizer_len: int, batches: dict[int, DataProto]):
        from small_step import HFUpdate, ModulesUpdate

        from tandem.serving.worker_thread import WorkerThread

        # On a thread of its own, as the services run model work: torch's 2 OpenMP threads driven
        # from the main thread ran the same update 6x slower (3.0 s against 0.49 s, 2026-12-01,
        # loadavg 13), spinning at the barriers.
        self.thread = WorkerThread(f"pure-{kind}")
        if kind == "modules":
            ensure_megatron(cfg)
            self.update = ModulesUpdate(cfg, hf_path, tokenizer_len)
        else:
            actor = cfg.actor_rollout_ref.actor
            self.update = HFUpdate(hf_path, actor.optim.lr, actor.clip_ratio)
        self.batches = batches

    async def step(self, i: int) -> tuple[float, dict]:
        batch = self.batches[i]
        c0, t0 = cpu_seconds([]), time.perf_counter()
        loss = await self.thread.run(self.update.step, batch)
        dt = time.perf_counter() - t0
        return dt, {"timing_s/update_actor_critic": dt, "bench/cpu_s": cpu_seconds([]) - c0, "pure/loss": loss,
                    "pure/real_tokens": float(batch["attention_mask"].sum()),
                    "pure/padded_tokens": float(batch["attention_mask"].numel())}

    async def close(self) -> None:
        self.thread.shutdown()


def ensure_megatron(cfg) -> None:
    """torch.distributed and megatron's parallel state for one rank in this process (once)."""
    import torch.distributed as dist

    from tandem.parallel.layout import ParallelConfig, init_distributed

    if not dist.is_initialized():
        init_distributed(ParallelConfig(), rank=0, world_size=1,
                         seed=cfg.actor_rollout_ref.actor.megatron.seed)  # same seed: same initial weights


if __name__ == "__main__" and sys.argv[1:2] == ["--driver"]:
    driver_main(int(sys.argv[2]), sys.argv[3:])
