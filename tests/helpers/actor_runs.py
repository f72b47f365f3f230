"""Launching tests/helpers/actor_rank.py at a layout and reading what it wrote; shared by
the actor parallel tests."""
import os
import sys

import torch

from tandem.parallel.layout import local_tcp_rendezvous

HERE = os.path.dirname(os.path.abspath(__file__))
MEMORY_METRICS = ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb")


def run_actor(run_ranks, root, name: str, tokenizer_dir: str, world: int, tp: int, pp: int = 1, ep: int = 1,
              cp: int = 1, sp: bool = False, init_from=None, load_from=None, settings=(),
              grouped: bool = False, own_prompts: bool = False, critic: bool = False):
    """One actor run of `world` gloo processes -> (rank 0's result.pt, its output directory)."""
    out = root / name
    out.mkdir()
    args = [str(world), str(tp), local_tcp_rendezvous(), str(out), tokenizer_dir, "--pp", str(pp), "--ep", str(ep),
            "--cp", str(cp)]
    args += ["--sp"] if sp else []
    args += ["--load-from", str(load_from)] if load_from else []
    args += ["--init-from", str(init_from)] if init_from else []
    args += [f"--set={s}" for s in settings]
    args += ["--grouped"] if grouped else []
    args += ["--own-prompts"] if own_prompts else []
    args += ["--critic"] if critic else []
    run_ranks([[sys.executable, os.path.join(HERE, "actor_rank.py"), str(r), *args] for r in range(world)],
              timeout=600)
    result = torch.load(out / "result.pt")
    if "metrics" in result:  # the process's memory figures differ between any two runs
        result["metrics"] = {k: v for k, v in result["metrics"].items() if k not in MEMORY_METRICS}
    return result, out


def hf_weights(d) -> dict[str, torch.Tensor]:
    """The Hugging Face export an actor run wrote under d/hf."""
    from safetensors.torch import load_file

    return load_file(os.path.join(d, "hf", "model.safetensors"))


def assert_same_weights(got: dict, want: dict, atol: float = 1e-5) -> None:
    assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=atol, rtol=0, msg=k)
