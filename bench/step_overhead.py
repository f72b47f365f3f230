"""Where a GRPO step's time goes: the step through the services against the same step
in-process, against another checkout's code, and against the update's pure compute.

One run, one machine, modes in alternating blocks (bench/step_modes.py has them):

  grpc      the real services started as `tandem run` starts them (actor, colocated, + reward),
            driven through controller.step.ppo_step with the real clients;
  inproc    the same workers built in this process behind adapters with the clients' method
            names, through the same ppo_step (--no-inproc: left out);
  baseline  grpc with the code of another checkout (--baseline-tree DIR, e.g. `git worktree add
            /tmp/base main`), in a driver process of its own: the before / after of a change;
  pure      (--pure) the update's arithmetic alone: forward + backward + AdamW on each grpc step's
            update batch with plain torch in this process (bench/small_step.py).

All see the same prompts and seeds step for step and start from the same weights, so they do
the same work (checked: every metric of the baseline must equal grpc's). Blocks alternate
(grpc, baseline, inproc, pure, grpc, ...) to cancel drift, after one untimed warm-up step
each. overhead share = 1 - t_inproc / t_grpc.

Codec: every DataProto the clients encode or decode during the timed gRPC steps is
recorded, and its full trip is re-timed here: encode_batch + SerializeToString on the
sender, FromString + decode_batch on the receiver (both sides of each wire crossing;
the services' side happens in their process, so it is re-timed here, median of 5).

    python bench/step_overhead.py [--blocks 5] [--steps 4] [--on-loop] [key=value ...]
    python bench/step_overhead.py --small --pure --no-inproc [--baseline-tree DIR [--baseline-drop KEY]...]

--small: issue 22's configuration (bench/small_step.py): a 2.9M-parameter Llama built here as
a Hugging Face checkpoint with the built-in tokenizer's vocabulary, 16 prompts x 8 samples of
the built-in task, 6 new tokens, lr 1e-5, no KL, token-mean. Defaults otherwise: the built-in
config with trainer.sft.total_steps=0; overrides are dotted keys as for `tandem run` (only the
colocated GRPO roles, actor + reward, are supported). Prints a markdown section for
bench/results/step_overhead.md.
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
from step_modes import BaselineMode, GrpcMode, InprocMode, PureMode, load_prompts  # noqa: E402

from tandem.config import load_config  # noqa: E402
from tandem.controller.run_dir import create_run_dir  # noqa: E402
from tandem.data import codec  # noqa: E402
from tandem.data.batch import DataProto  # noqa: E402
from tandem.logging import configure_logging  # noqa: E402
from tandem.v1 import data_pb2  # noqa: E402

PHASES = ["gen", "reward", "old_log_prob", "adv", "update_actor"]  # verl's timing_s/* names (controller/step.py)
CHECK_KEYS = ["critic/score/mean", "response_length/mean", "actor/pg_loss"]
VOLATILE = ("timing_s/", "perf/throughput", "perf/time_per_step", "perf/cpu_memory", "bench/")


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

# keys older trees may not have, with the value that is their behaviour: the unpadded task older
# trees write; every row with its own prompt
OLD_BEHAVIOUR = {"data.builtin_fixed_width": "false"}


def known_to(tree: str, overrides: list[str]) -> list[str]:
    """The overrides without keys that `tree` (older code) does not have, where leaving them out
    is its behaviour anyway (OLD_BEHAVIOUR; None: whatever the value, it is this tree's change)."""
    with open(os.path.join(tree, "tandem", "config", "schema.py")) as f:
        schema = f.read()

    def dropped(o: str) -> bool:
        key, _, value = o.partition("=")
        return (key in OLD_BEHAVIOUR and key.rsplit(".", 1)[1] not in schema
                and OLD_BEHAVIOUR[key] in (None, value))
    return [o for o in overrides if not dropped(o)]


async def measure(cfg, run_dir, a, overrides: list[str], hf_path: str | None) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.tokenizer_path)
    count = 1 + a.blocks * a.steps
    prompts = load_prompts(cfg, tokenizer, count)
    modes: dict = {"grpc": GrpcMode(cfg, run_dir, tokenizer, prompts, record=a.pure)}
    modes["grpc"].start()
    await asyncio.sleep(0)  # start() spawns the services before its first wait
    if a.baseline_tree:
        kept = [o for o in overrides if o.partition("=")[0] not in a.baseline_drop]  # its defaults for those
        modes["baseline"] = BaselineMode(a.baseline_tree, [*known_to(a.baseline_tree, kept),
                                                           "trainer.experiment_name=baseline"], count)
    recorder = CodecRecorder()
    try:
        t0 = time.perf_counter()
        if not a.no_inproc:  # built while the services start
            modes["inproc"] = InprocMode(cfg, tokenizer, prompts, a.on_loop)
        torch.set_num_threads(max(1, cfg.services.actor.torch_threads))  # pure compute: as the actor service
        t_build = time.perf_counter() - t0
        for m in ("grpc", "baseline"):
            if m in modes:
                await modes[m].connect()
        if a.pure:
            for kind in ("pure", "hf"):
                modes[kind] = PureMode("modules" if kind == "pure" else "hf", hf_path, cfg, len(tokenizer),
                                       modes["grpc"].update_batches)
        times = {m: [] for m in modes}
        metrics = {m: [] for m in modes}
        for mode in modes.values():  # warm-up: prompts[0], step 0 (pure: grpc's step-0 batch)
            await mode.step(0)
        for b in range(a.blocks):
            for m, mode in modes.items():
                recorder.on = m == "grpc"
                for j in range(a.steps):
                    dt, met = await mode.step(1 + b * a.steps + j)
                    times[m].append(dt)
                    metrics[m].append(met)
                recorder.on = False
        recorder.restore()
        trips = [codec_trip_s(bt) for bt in recorder.batches]
    finally:
        recorder.restore()
        for mode in modes.values():
            await mode.close()
    return {"times": times, "metrics": metrics, "trips": trips, "t_build": t_build,
            "rows": len(prompts[0]) * cfg.actor_rollout_ref.rollout.n}


def machine() -> str:
    u = platform.uname()
    return (f"{u.machine}, nproc {os.cpu_count()}, python {platform.python_version()}, torch {torch.__version__}, "
            f"protobuf {google.protobuf.__version__}, grpcio {grpc.__version__}, "
            f"loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())} at start")


def _median_phases(metrics: list[dict]) -> dict[str, float]:
    return {p: statistics.median(x.get(f"timing_s/{p}", 0.0) for x in metrics) for p in PHASES}


def _max_diffs(a: list[dict], b: list[dict], keys=None) -> dict[str, float]:
    """max |a - b| over the steps, per metric key (every non-timing key of both when keys is None)."""
    keys = keys or sorted({k for x in a + b for k in x if not k.startswith(VOLATILE)})
    return {k: max(abs(float(x.get(k, 0.0)) - float(y.get(k, 0.0))) for x, y in zip(a, b)) for k in keys}


def _table(res: dict, steps: int) -> list[str]:
    names = [m for m in ("grpc", "baseline", "inproc", "pure", "hf") if m in res["times"]]
    title = {"grpc": "gRPC (services)", "baseline": "gRPC, baseline tree", "inproc": "in-process",
             "pure": "pure compute: update, plain torch", "hf": "update in transformers, padded"}
    blk = lambda ts: ", ".join(f"{statistics.mean(ts[i:i + steps]):.3f}" for i in range(0, len(ts), steps))  # noqa: E731
    rows = [f"| | {' | '.join(title[m] for m in names)} |", f"| --- |{' ---: |' * len(names)}",
            f"| median step s ({len(res['times']['grpc'])} steps) | "
            + " | ".join(f"{statistics.median(res['times'][m]):.3f}" for m in names) + " |",
            "| mean step s | " + " | ".join(f"{statistics.mean(res['times'][m]):.3f}" for m in names) + " |",
            "| median CPU s per step (controller + services; load-proof) | " + " | ".join(
                f"{statistics.median(x['bench/cpu_s'] for x in res['metrics'][m]):.3f}" for m in names) + " |"]
    ph = {m: _median_phases(res["metrics"][m]) for m in names}
    for p in PHASES:
        rows.append(f"| phase {p} s (median) | " + " | ".join(
            "" if m in ("pure", "hf") and p != "update_actor" else f"{ph[m][p]:.3f}" for m in names) + " |")
    rows.append("| block means s | " + " | ".join(blk(res["times"][m]) for m in names) + " |")
    return rows


def _findings(res: dict, steps: int) -> list[str]:
    tg = res["times"]["grpc"]
    mg, n = statistics.mean(tg), len(tg)
    out = []
    if "inproc" in res["times"]:
        ti = res["times"]["inproc"]
        mi = statistics.mean(ti)
        diffs = [statistics.mean(tg[i:i + steps]) - statistics.mean(ti[i:i + steps]) for i in range(0, n, steps)]
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
        codec_s = sum(t for t, _ in res["trips"]) / n
        wire = sum(b for _, b in res["trips"]) / n
        same = _max_diffs(res["metrics"]["grpc"], res["metrics"]["inproc"], CHECK_KEYS)
        out += [f"- overhead share (gRPC + codec + process boundary) = 1 - t_inproc/t_grpc = **{1 - mi / mg:.1%}** "
                f"({mg - mi:+.3f} s per step; +/- {se:.3f} s standard error from the paired block differences); "
                f"from medians: {1 - statistics.median(ti) / statistics.median(tg):.1%}",
                f"- codec (encode+serialize, parse+decode, both ends of each crossing): {codec_s * 1e3:.1f} ms per step "
                f"= **{codec_s / mg:.1%}** of the gRPC step ({len(res['trips']) // n} batches, "
                f"{wire / 1e6:.2f} MB on the wire per step)",
                "- same work in gRPC and in-process: max |difference| over steps of "
                + ", ".join(f"{k} {v:.2g}" for k, v in same.items()),
                f"- in-process workers built in {res['t_build']:.1f} s (not timed in the steps)"]
    if "baseline" in res["times"]:
        tb = res["times"]["baseline"]
        upd = lambda m: statistics.median(x["timing_s/update_actor"] for x in res["metrics"][m])  # noqa: E731
        diff = _max_diffs(res["metrics"]["grpc"], res["metrics"]["baseline"])
        worst = max(diff.values(), default=0.0)
        out += [f"- this code / baseline tree: median step **{statistics.median(tg) / statistics.median(tb):.3f}** "
                f"({statistics.median(tg):.3f} / {statistics.median(tb):.3f} s), mean step "
                f"{mg / statistics.mean(tb):.3f}, UpdateActor phase {upd('grpc') / upd('baseline'):.3f}",
                f"- same numbers as the baseline tree: {len(diff)} metrics compared over {n} steps, "
                f"max |difference| {worst:.3g}" + ("" if worst == 0 else " (**not bit-equal**: "
                                                    + ", ".join(f"{k} {v:.2g}" for k, v in diff.items() if v) + ")")]
    if "pure" in res["times"]:
        pure, hf = (statistics.median(res["times"][m]) for m in ("pure", "hf"))
        upd = statistics.median(x["timing_s/update_actor"] for x in res["metrics"]["grpc"])
        pm = res["metrics"]["hf"]
        out += [f"- UpdateActor call (controller's view, median) / pure compute (median): "
                f"**{upd / pure:.2f}x** ({upd * 1e3:.0f} / {pure * 1e3:.0f} ms; what the call adds to the math: "
                f"{(upd - pure) * 1e3:+.0f} ms); whole gRPC step / pure update {statistics.median(tg) / pure:.2f}x",
                "- pure compute: the actor's model (megatron-core GPTModel, same checkpoint, rows packed as the actor "
                "packs them, its PPO loss) in a plain torch loop: forward, backward, clip_grad_norm_, torch AdamW "
                "(bench/small_step.py ModulesUpdate), called on a thread of its own as the services call the model",
                f"- the same update in transformers (LlamaForCausalLM, padded as a single-process trainer runs it): "
                f"{hf * 1e3:.0f} ms = {upd / hf:.2f}x of it for the UpdateActor call; "
                f"{statistics.mean(x['pure/padded_tokens'] for x in pm):.0f} padded tokens per update, "
                f"{statistics.mean(x['pure/real_tokens'] for x in pm):.0f} real"]
    return out


def report(res: dict, cfg, overrides: list[str], a, argv: list[str], started: str, load_start: str,
           model: str) -> str:
    r = cfg.actor_rollout_ref
    lines = [
        "## step overhead (where a GRPO step's time goes)",
        "",
        f"- date: {started}",
        f"- command: `{shlex.join(['python', 'bench/step_overhead.py', *argv])}`",
        f"- machine: {load_start}; loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())} at end",
        f"- config: defaults + {shlex.join(overrides) or '(none)'}: {cfg.algorithm.adv_estimator}, "
        f"{cfg.data.train_batch_size} prompts x n={r.rollout.n} = {res['rows']} rows, "
        f"max_response_length {cfg.data.max_response_length}, model {model}, "
        f"ppo_mini_batch_size {r.actor.ppo_mini_batch_size}, micro {r.actor.ppo_micro_batch_size_per_gpu}, "
        f"use_kl_loss {r.actor.use_kl_loss}, actor torch_threads {cfg.services.actor.torch_threads} (every mode)",
        f"- design: {a.blocks} blocks x {a.steps} steps per mode, alternating, 1 untimed warm-up step each; "
        f"same prompts, seeds and initial weights in every mode; in-process workers run "
        f"{'on the event loop thread (--on-loop)' if a.on_loop else 'on a WorkerThread, as in the services'}"
        + (f"; baseline tree {a.baseline_tree}" if a.baseline_tree else "")
        + (f" at its defaults for {', '.join(a.baseline_drop)}" if a.baseline_tree and a.baseline_drop else ""),
        "",
        *_table(res, a.steps),
        "",
        *_findings(res, a.steps),
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, default=5, help="blocks per mode (alternating)")
    p.add_argument("--steps", type=int, default=4, help="timed steps per block")
    p.add_argument("--on-loop", action="store_true",
                   help="in-process: call the workers on the event loop's thread, not a WorkerThread")
    p.add_argument("--small", action="store_true", help="issue 22's configuration from a 2.9M Llama built here")
    p.add_argument("--pure", action="store_true", help="also time the update's pure compute (plain torch)")
    p.add_argument("--no-inproc", action="store_true", help="leave the in-process mode out")
    p.add_argument("--baseline-tree", help="also run the gRPC steps with this checkout's code (before / after)")
    p.add_argument("--baseline-drop", action="append", default=[], metavar="KEY",
                   help="leave this override key out of the baseline's run (its default there); repeatable")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, key=value")
    a = p.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_start = machine()
    configure_logging(role="controller", level="WARNING")
    tmp = tempfile.mkdtemp(prefix="tandem-step-overhead-")
    overrides = ["trainer.sft.total_steps=0"]
    hf_path, model = None, None
    if a.small:
        from small_step import SMALL_OVERRIDES, build_small_llama

        hf_path, params = build_small_llama(tmp)
        overrides += [f"actor_rollout_ref.model.path={hf_path}", *SMALL_OVERRIDES]
        model = f"Llama from a Hugging Face checkpoint built by the bench, {params / 1e6:.2f}M parameters"
    if a.pure and not hf_path:
        p.error("--pure needs --small (the plain-torch model loads the Hugging Face checkpoint)")
    overrides += a.overrides
    base = [f"trainer.default_local_dir={tmp}", "trainer.experiment_name=step_overhead"]
    cfg = load_config(None, [*base, *overrides])
    shape = cfg.actor_rollout_ref.model
    model = model or f"{shape.num_hidden_layers}x{shape.hidden_size}"
    try:
        cfg, run_dir = create_run_dir(cfg)
        res = asyncio.run(measure(cfg, run_dir, a, [f"trainer.default_local_dir={tmp}", *overrides], hf_path))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(report(res, cfg, overrides, a, argv, started, load_start, model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
