"""services.compile_cache_dir: torch.compile's caches go under it (and back to the process's own
without it); a relative path is refused, naming the key."""
import os
import subprocess
import sys

import pytest

from tandem.config import ConfigError, load_config
from tandem.serving.compile_cache import use_compile_cache


def test_variables_set_and_restored(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/else")
    import tandem.serving.compile_cache as cc

    monkeypatch.setattr(cc, "_BEFORE", {"TORCHINDUCTOR_CACHE_DIR": None, "TRITON_CACHE_DIR": "/somewhere/else"})
    use_compile_cache(str(tmp_path))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton")
    assert (tmp_path / "inductor").is_dir() and (tmp_path / "triton").is_dir()
    use_compile_cache(None)  # the next run has no key: the process's own values again
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and os.environ["TRITON_CACHE_DIR"] == "/somewhere/else"


def test_relative_directory_is_refused():
    with pytest.raises(ConfigError, match="services.compile_cache_dir") as e:
        load_config(None, ["services.compile_cache_dir=cache"])
    assert "absolute" in str(e.value)
    assert load_config(None, []).services.compile_cache_dir is None


FUNCTION_GRAPH = """
import sys, torch
from torch._dynamo.utils import counters
from tandem.serving.compile_cache import use_compile_cache

class Twice(torch.autograd.Function):  # as shared-prompt attention: a Function inside a compiled region
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2

def compiled(f):  # (cache hits, bypasses) of one compiled graph holding the Function
    counters.clear()
    x = torch.randn(8, requires_grad=True)
    torch.compile(lambda x: f(Twice.apply(x.sin())).sum())(x).backward()
    c = counters["aot_autograd"]
    return c["autograd_cache_hit"], c["autograd_cache_bypass"]

use_compile_cache(sys.argv[1])
if sys.argv[2] == "first":  # the control: unmarked, torch bypasses the cache (a graph of its own)
    print(*compiled(torch.tanh))
from tandem.models.compile import cache_autograd_functions
cache_autograd_functions()
print(*compiled(torch.cos))
"""


def _function_graph(cache: str, mode: str) -> list[tuple[int, int]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", FUNCTION_GRAPH, cache, mode], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return [tuple(map(int, line.split())) for line in out.stdout.splitlines()[-2 if mode == "first" else -1:]]


def test_graphs_with_an_autograd_function_are_loaded_from_the_cache_once_marked(tmp_path):
    """tandem/models/compile.py's cache_autograd_functions: a second process loads a graph holding a
    torch.autograd.Function from the on-disk cache instead of tracing it again; unmarked, torch
    bypasses the cache (the control, in the first process: nothing saved for a later process). A real
    torch.compile (inductor, CPU) in a fresh process after use_compile_cache: the graph lands under
    its directory."""
    assert _function_graph(str(tmp_path), "first") == [(0, 1), (0, 0)]
    files = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "inductor") for f in fs]
    assert any("fxgraph" in f for f in files), files[:20]
    assert _function_graph(str(tmp_path), "again") == [(1, 0)]
