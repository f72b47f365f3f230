"""Standalone rollout replicas: one generation request split over N rollout services.

The prompts are cut into N contiguous ranges balanced by tokens (a prompt costs
n x (its tokens + max_new_tokens)), whole prompt groups each; replica k gets its range with
`row_offset` = the global number of its first output row. Rows are sampled by (seed, global
row, position) (tandem/generation/sampling.py), so with one seed for all replicas N replicas
give exactly the rows one would, and the parts concatenate back in the request's order.
Every reply must carry the weights version the replicas were last synced to
(controller/weight_sync.py sets it): a replica that generated on other weights fails the step.

Used for every standalone rollout (N = 1 is one range); the colocated rollout is a plain client.
"""
from __future__ import annotations

import asyncio

import torch

from tandem.controller.clients import RolloutClient
from tandem.data.batch import DataProto
from tandem.rollout.outputs import concat_generations


def replica_roles(replicas: int) -> list[str]:
    """The launcher's names of the rollout replicas: rollout, rollout-1, ... (logs/<name>.log)."""
    return ["rollout"] + [f"rollout-{k}" for k in range(1, replicas)]


def split_prompts(costs: list[int], parts: int) -> list[tuple[int, int]]:
    """Contiguous ranges [a, b) of prompt indices, `parts` of them (some empty when there are
    fewer prompts), each cut where the running cost is nearest its share of the total."""
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    cuts, last = [0], 0
    for k in range(1, parts):
        target = prefix[-1] * k / parts
        best = min(range(last, len(costs) + 1), key=lambda i: (abs(prefix[i] - target), i))
        cuts.append(best)
        last = best
    cuts.append(len(costs))
    return list(zip(cuts[:-1], cuts[1:]))


class RolloutReplicas:
    """The controller's rollout in standalone mode: RolloutClient's generate over N replicas."""

    def __init__(self, clients: list[RolloutClient], pad_id: int):
        self.clients = clients
        self.pad_id = pad_id
        self.expected_version: int | None = None  # set by each successful sync

    def set_metadata(self, **kv) -> None:
        for c in self.clients:
            c.set_metadata(**kv)

    async def close(self) -> None:
        for c in self.clients:
            await c.close()

    async def generate_sequences(self, batch: DataProto, *, max_new_tokens: int, n: int = 1,
                                 seed: int | None = None, greedy: bool = False, **sampling) -> DataProto:
        if seed is None:  # one seed for every replica: their rows are then one request's rows
            seed = int(torch.randint(0, 2**31, ()).item())
        lengths = batch["attention_mask"].sum(-1).tolist()
        ranges = split_prompts([n * (int(x) + max_new_tokens) for x in lengths], len(self.clients))
        calls = [(k, c.generate_sequences(batch.slice(a, b), max_new_tokens=max_new_tokens, n=n, seed=seed,
                                          greedy=greedy, row_offset=a * n, **sampling))
                 for k, (c, (a, b)) in enumerate(zip(self.clients, ranges)) if b > a]
        parts = await asyncio.gather(*(call for _, call in calls))
        for (k, _), part in zip(calls, parts):
            self._check_version(k, part)
        return concat_generations(parts, self.pad_id)

    def _check_version(self, replica: int, part: DataProto) -> None:
        got = part.meta.get("weights_version")
        if self.expected_version is not None and got is not None and int(got) != self.expected_version:
            raise RuntimeError(f"rollout replica {replica} ({self.clients[replica].endpoint}) generated with weights "
                               f"version {int(got)}, expected {self.expected_version} (a stale or restarted rollout)")
