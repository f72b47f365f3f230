"""Fixtures shared by every test directory, and one marker per test layer.

Layers (folders; select with `-m`, e.g. `pytest -m "unit or wire"` for the fast ones):
unit (in-process, pure or one-rank), wire (codec and gRPC edge), services (real service
processes), multirank (gloo groups of several processes), e2e (whole `tandem run`s).
tests/helpers holds what several layers share: tiny Hugging Face checkpoints, rank scripts.
"""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("unit", "wire", "services", "multirank", "e2e")
sys.path.insert(0, str(ROOT / "tests" / "helpers"))


# session fixtures that start processes: the files using one run on the same pytest-xdist worker
SHARED_PROCESSES = ("services", "ppo_reference", "example_server")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config, items):
    group: dict[str, str] = {}  # test file -> its xdist group: the file, or the shared fixture one of its tests uses
    for item in items:
        layer = Path(item.fspath).relative_to(ROOT / "tests").parts[0]
        if layer not in LAYERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in one of tests/{{{','.join(LAYERS)}}}")
        item.add_marker(getattr(pytest.mark, layer))
        file = item.nodeid.split("::")[0]
        shared = [f for f in SHARED_PROCESSES if f in item.fixturenames]
        group[file] = shared[0] if shared else group.get(file, file)
    if config.pluginmanager.hasplugin("xdist"):  # a file's module fixtures start once: the whole file on one worker
        for item in items:
            item.add_marker(pytest.mark.xdist_group(group[item.nodeid.split("::")[0]]))


def _run_ranks(cmds: list[list[str]], timeout: float) -> list[str]:
    """Start one process per command (the ranks of a gloo group), wait for all, and fail
    with every rank's output tail if any exits non-zero. -> each rank's output."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for cmd in cmds]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    tails = "\n".join(f"--- rank {r} (rc={p.returncode}) ---\n{o[-3000:]}"
                      for r, (p, o) in enumerate(zip(procs, outs)))
    assert all(p.returncode == 0 for p in procs), tails
    return outs


@pytest.fixture(scope="session")
def run_ranks():
    return _run_ranks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def megatron_dist():
    """A 1-rank gloo process group + megatron parallel_state, once per test process."""
    from tandem.parallel.layout import ParallelConfig, init_distributed

    if not torch.distributed.is_initialized():
        init_distributed(ParallelConfig(), 0, 1, f"tcp://127.0.0.1:{_free_port()}", seed=1)
    yield


@pytest.fixture(scope="session")
def example_server(tmp_path_factory):
    """The example tool server (tools and the guess_number environment) in its own process -> its endpoint."""
    from tool_server import example_tool_server

    with example_tool_server(tmp_path_factory.mktemp("tools")) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def arithmetic_tokenizer(tmp_path_factory):
    """The built-in character tokenizer, written once to a temp dir and loaded back."""
    from transformers import AutoTokenizer

    from tandem.tasks.arithmetic import build_tokenizer

    path = build_tokenizer(str(tmp_path_factory.mktemp("tok") / "tokenizer"))
    return AutoTokenizer.from_pretrained(path)
