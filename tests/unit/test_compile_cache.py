"""services.compile_cache_dir: torch.compile's caches go under it (and back to the process's own
without it); a relative path is refused, naming the key."""
import os
import subprocess
import sys
import textwrap

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


def test_torch_compile_writes_its_cache_there(tmp_path):
    """A real torch.compile (inductor, CPU) in a fresh process after use_compile_cache: the compiled
    graph lands under the directory, not in /tmp."""
    code = textwrap.dedent(f"""
        import torch
        from tandem.serving.compile_cache import use_compile_cache
        use_compile_cache({str(tmp_path)!r})
        f = torch.compile(lambda x: (x * 2).sin().sum())
        print(float(f(torch.ones(8))))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    files = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "inductor") for f in fs]
    assert any("fxgraph" in f for f in files), files[:20]
