"""The tables and lines bench/e2e_step.py prints from its summarised runs (`summarise`'s dicts): one
row per run, variants over the baseline, each run's first step and its compile, each steady step.

Deliberately not here: running and summarising (e2e_step.py), the roofline's counts (e2e_roofline.py).
"""
from __future__ import annotations

import statistics

PHASES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor"]  # verl's timing_s/* (controller/step.py)


HEAD = ("| config | step s | gen | old log-prob | ref (started with old: includes its wait) | update | reward "
        "| other (no phase timer) | tokens/s/GPU | MFU update | MFU log-prob "
        "| roofline s (train + log-prob + gen) | step at roofline | the same, generation's bytes only "
        "| first step s (compile + capture s) | before step 1 "
        "compile + capture s |")


def row(x: dict) -> str:
    p = x["roof_parts"]
    return (f"| {x['name']} | {x['step_s']:.2f} | {x['gen']:.2f} | {x['old_log_prob']:.2f} | {x['ref']:.2f} "
            f"| {x['update_actor']:.2f} | {x['reward']:.2f} | {x['other_s']:.2f} | {x['tokens_s_gpu'] / 1e3:.1f}k "
            f"| {x['mfu_train']:.1%} "
            f"| {x['mfu_logprob']:.1%} | {x['roofline_s']:.2f} "
            f"({p['train']:.2f} + {p['logprob']:.2f} + {p['gen']:.2f}) | {x['fraction']:.0%} "
            f"| {p['step_bytes_only']:.2f} s: {p['step_bytes_only'] / x['step_s']:.0%} "
            f"| {x['first_step_s']:.1f} ({x['first_compile_s']:.1f} + {x['first_capture_s']:.1f}) "
            f"| {x['before_compile_s']:.1f} + {x['before_capture_s']:.1f} |")


def compare_lines(done: dict) -> list[str]:
    base = done.get("baseline")
    out = []
    for name, xs in done.items():
        if name == "baseline" or not base:
            continue
        ratio = lambda k: statistics.median(x[k] for x in xs) / statistics.median(b[k] for b in base)  # noqa: E731
        out.append(f"- {name} ({' '.join(xs[0]['extra'])}) / baseline, medians over {len(xs)} run(s) each: "
                   f"step **{ratio('step_s'):.3f}**, " + ", ".join(
                       f"{p} {ratio(p):.3f}" for p in PHASES if statistics.median(b[p] for b in base) > 0)
                   + f", first step {ratio('first_step_s'):.3f}")
    return out


def cold_start_lines(done: dict) -> list[str]:
    """The first step of each later run of a configuration over its steady step (the issue's goal: <= 2,
    compiled artifacts reused from the run before)."""
    return [f"- {name}, run {i + 1}: first step {x['first_step_s']:.1f} s = **{x['first_step_s'] / x['step_s']:.1f}x** "
            f"its steady step (compile {x['first_compile_s']:.1f} s, graph capture {x['first_capture_s']:.1f} s; "
            f"before step 1: {x['before_compile_s']:.1f} + {x['before_capture_s']:.1f} s){_split(x)}{_wall(x)}"
            for name, xs in done.items() for i, x in enumerate(xs)]


def step_lines(done: dict) -> list[str]:
    """Each run's steady steps one by one (step, old log-prob, reference, update s; compile + capture s and
    seconds of Python's garbage collection in the step, over every process), and the roofline of the work the
    run did when it did less than the configured step's (shared prompts; old log-probs of the first mini-batch
    from the update)."""
    out = []
    for name, xs in done.items():
        for i, x in enumerate(xs):
            steps = "; ".join(f"{p['step']:.2f} ({p['old_log_prob']:.2f} / {p['ref']:.2f} / {p['update_actor']:.2f}"
                              f", compile {p['compile_s']:.1f}, gc {p['gc'][0]:.2f} in {p['gc'][1]} full)"
                              for p in x["per_step"])
            out.append(f"- {name}, run {i + 1}, steady steps: step s (old log-prob / ref / update; compile s, "
                       f"garbage collection s in full collections): {steps}")
            if x["shared"] > 1 or x["old_share"] < 1:
                did = ([f"prompts computed once per {x['shared']} rows"] * (x["shared"] > 1)
                       + [f"the old log-prob pass over {x['old_share']:.0%} of the rows (the update's own forward gives "
                          "the first mini-batch's)"] * (x["old_share"] < 1))
                out.append(f"- {name}, run {i + 1}: {'; '.join(did)}: the roofline of that work "
                           f"{x['work_roofline_s']:.2f} s, the step at {x['work_roofline_s'] / x['step_s']:.0%} of it")
    return out


def _wall(x: dict) -> str:
    """What else the run's wall time held: what a user waits for besides the steps."""
    save, left = x["final_save_s"], x.get("checkpoints_left", [])
    if save == save:
        save = f"the final checkpoint {save:.1f} s"
    elif left:  # NaN with a checkpoint left: the run was stopped while saving
        save = "the final checkpoint not finished"
    else:
        save = "no checkpoint written"
    return (f"; run wall {x['wall_s']:.0f} s: services answering after {x['startup_s']:.1f} s, {save}; "
            f"checkpoints left: {', '.join(left) or 'none'}")


def _split(x: dict) -> str:
    """Step 1's compile time as torch splits it: dynamo's tracing (frames less backends), the backends
    (AOT autograd + inductor), inductor's share, its code generation, waits for parallel compile workers."""
    p = x.get("first_compile_phases") or {}
    if not p.get("frame_s"):
        return ""
    split = (f"; of the compile: tracing {p['frame_s'] - p.get('backend_s', 0.0):.1f} s, backends "
             f"{p.get('backend_s', 0.0):.1f} s (inductor {p.get('inductor_s', 0.0):.1f}, code gen "
             f"{p.get('code_gen_s', 0.0):.1f}, compile-worker waits {p.get('async_compile_wait_s', 0.0):.1f})")
    pool = f"; compile worker pool up after {p.get('pool_up', 0):.0f} of {p.get('calls', 0):.0f} compiling calls"
    return split + _caches(p) + pool


def _caches(p: dict) -> str:
    """How torch's on-disk caches answered during step 1 (bypass: a graph the cache cannot hold)."""
    return "".join(f"; {what} cache hit / miss / bypass {p.get(k + '_cache_hit', 0):.0f} / "
                   f"{p.get(k + '_cache_miss', 0):.0f} / {p.get(k + '_cache_bypass', 0):.0f}"
                   for k, what in (("fx", "FX graph"), ("aot", "AOT autograd")))
