"""Fixtures for in-process tests that build megatron-core models (CPU, fp32)."""
import socket

import pytest
import torch


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
def arithmetic_tokenizer(tmp_path_factory):
    """The built-in character tokenizer, written once to a temp dir and loaded back."""
    from transformers import AutoTokenizer

    from tandem.tasks.arithmetic import build_tokenizer

    path = build_tokenizer(str(tmp_path_factory.mktemp("tok") / "tokenizer"))
    return AutoTokenizer.from_pretrained(path)
