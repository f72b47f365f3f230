"""CUDA graphs for the decode step: capture once per static shape, replay per token.

A captured step reads and writes only persistent buffers (the KV cache, the per-slot
state and the window buffers of `runner.py`), so replaying it advances decoding with
one launch and no host work. The graphs also bake in the weights' addresses: the
runner drops them when a parameter tensor is replaced (in-place updates, as the
optimizer and `load_state_dict` do, keep them valid).

This is the one module of the engine that touches `torch.cuda` (graph capture has no
device-neutral API); on CPU the runner calls the step directly.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Hashable

import torch

CAPTURE_SECONDS = [0.0]  # wall seconds this process spent capturing (warm-up run included): the cold start's share


class DecodeGraphs:
    def __init__(self):
        self._graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self._pool = None

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        self._graphs.clear()
        self._pool = None

    def replay(self, key: Hashable, step: Callable[[], None], state: list[torch.Tensor]) -> None:
        """Run `step` (one decode step on static buffers) through its graph for `key`,
        capturing it first. `state`: the buffers `step` mutates that must be unchanged
        by the warm-up run before capture (it is restored)."""
        graph = self._graphs.get(key)
        if graph is None:
            t0 = time.perf_counter()
            graph = self._capture(step, state)
            torch.cuda.synchronize()
            CAPTURE_SECONDS[0] += time.perf_counter() - t0
            self._graphs[key] = graph
        graph.replay()

    def _capture(self, step, state) -> torch.cuda.CUDAGraph:
        saved = [t.clone() for t in state]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: lazy inits (cuBLAS handles, workspaces)
            step()
        torch.cuda.current_stream().wait_stream(side)
        for t, s in zip(state, saved):
            t.copy_(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            step()
        self._pool = graph.pool()
        return graph
