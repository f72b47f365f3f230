"""Where a Triton kernel test runs: on CUDA when present; on CPU through Triton's interpreter, in a
subprocess started with TRITON_INTERPRET=1 (triton reads it when it is first imported, so it cannot be
switched on in the test process). A kernel test file takes `kernel_device()` in its fixture and has one
test calling `run_in_interpreter(__file__, ...)`, which the CUDA and interpreter runs skip."""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ONLY_WHERE_KERNEL_TESTS_SKIP = pytest.mark.skipif(not HAS_TRITON or INTERPRETED or torch.cuda.is_available(),
                                                  reason="needs triton, and only where the kernel tests would skip")


def kernel_device() -> str:
    """'cuda', or 'cpu' inside the interpreter's subprocess; skips the test elsewhere."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    if torch.cuda.is_available():
        return "cuda"
    if INTERPRETED:
        return "cpu"
    pytest.skip("CPU: runs in the interpreter's subprocess (run_in_interpreter)")


def run_in_interpreter(test_file: str, select: str) -> None:
    """The file's tests selected by `-k select` in a process started with TRITON_INTERPRET=1: all pass,
    none skipped."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file, "-k", select],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and " passed" in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]
    assert "skipped" not in r.stdout, r.stdout[-4000:]  # every kernel test ran there
