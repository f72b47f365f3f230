"""Validation every `trainer.test_freq` steps, with verl's metric names.

Two passes over the validation prompts, both scored by the reward service:

* greedy (one response per prompt): `val/accuracy` over all prompts;
* the configured `actor_rollout_ref.rollout.val_kwargs` (n samples per prompt with
  `do_sample=true`, else the greedy pass itself): per `data_source`, verl's
  `process_validation_metrics` statistics of the score ("reward") with the extracted
  answer ("pred") as the vote for maj@k, logged as verl logs them:
  `val-core/{data_source}/reward/{mean@N, best@N/mean, maj@N/mean}` and everything
  else (std@N, worst@k, smaller k) under `val-aux/`. With sampling on, the greedy
  per-source mean is logged as `val-aux/{data_source}/reward_greedy/mean@1`.

`greedy_accuracy` is the greedy pass alone (the initial policy's accuracy, before SFT).

best@k, worst@k and maj@k are bootstrap estimates (1000 resamples of k of the N
responses, fixed seed), as in verl. With `samples` given, run_validation also returns the
first trainer.log_val_generations (prompt, response, score) triples, picked as verl picks them
(sorted by prompt, shuffled with seed 42). Deliberately not here: pass@k estimators, writing
the samples (controller/tracking.py).
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from tandem.algos import metrics as M
from tandem.controller.data import Example, collate
from tandem.controller.reward_calls import settle
from tandem.controller.scoring import decode_responses, score

N_BOOTSTRAP = 1000
ANSWER_MARKER = "####"


def extract_pred(response: str) -> str:
    """The answer a response commits to, for majority voting: the text after the last
    '####' when there is one (GSM8K format), else the whole stripped response."""
    idx = response.rfind(ANSWER_MARKER)
    text = response[idx + len(ANSWER_MARKER):] if idx >= 0 else response
    return text.strip()


def bootstrap_metric(data: list, subset_size: int, reduce_fns, n_bootstrap: int = N_BOOTSTRAP,
                     seed: int = 42) -> list[tuple[float, float]]:
    """(mean, std) over `n_bootstrap` resamples (with replacement) of `subset_size` items
    of each reduce_fn's value: verl's `bootstrap_metric`."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(data), size=(n_bootstrap, subset_size))
    out = []
    for fn in reduce_fns:
        vals = np.array([fn([data[i] for i in row]) for row in idx], dtype=np.float64)
        out.append((float(vals.mean()), float(vals.std())))
    return out


def calc_maj_val(data: list[dict], vote_key: str = "pred", val_key: str = "val") -> float:
    """The `val_key` of the first item whose `vote_key` got the most votes (ties: the vote
    seen first), as verl's `calc_maj_val`."""
    votes: dict[Any, list] = defaultdict(list)
    for d in data:
        votes[d[vote_key]].append(d[val_key])
    best = max(votes, key=lambda k: len(votes[k]))
    return votes[best][0]


def _bootstrap_stats(vals: list[float], preds: list | None, k: int, seed: int) -> dict[str, tuple[float, float]]:
    """bootstrap_metric with reduce_fns max, min and calc_maj_val, vectorised (the same
    resample indices for all three, as verl's reseeded calls use)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(vals), size=(N_BOOTSTRAP, k))
    v = np.asarray(vals, dtype=np.float64)[idx]  # [N_BOOTSTRAP, k]
    out = {"best": v.max(1), "worst": v.min(1)}
    if preds is not None:
        codes = {p: i for i, p in enumerate(dict.fromkeys(preds))}
        c = np.asarray([codes[p] for p in preds])[idx]  # [N_BOOTSTRAP, k]
        counts = (c[:, :, None] == c[:, None, :]).sum(-1)  # votes for each position's answer
        first_top = counts.argmax(1)  # first position holding a most-voted answer
        out["maj"] = v[np.arange(N_BOOTSTRAP), first_top]
    return {name: (float(x.mean()), float(x.std())) for name, x in out.items()}


def _k_values(n: int) -> list[int]:
    ks, k = [], 2
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def process_validation_metrics(data_sources: list[str], uids: list, infos: dict[str, list],
                               seed: int = 42) -> dict[str, dict[str, dict[str, float]]]:
    """{data_source: {var: {metric: value}}} averaged over prompts (uids): mean@N, std@N,
    best@k/{mean,std}, worst@k/{mean,std}, maj@k/{mean,std} (when infos has "pred") for
    k = 2, 4, ... < N and N. String-valued variables (e.g. "pred") get no metrics."""
    groups: dict[str, dict[Any, dict[str, list]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for i, (source, uid) in enumerate(zip(data_sources, uids, strict=True)):
        for var, vals in infos.items():
            groups[source][uid][var].append(vals[i])
    # source -> var -> metric -> one value per prompt
    per_prompt: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for source, by_uid in groups.items():
        for var2vals in by_uid.values():
            for var, vals in var2vals.items():
                if isinstance(vals[0], str):
                    continue
                n = len(vals)
                metric = {f"mean@{n}": float(np.mean(vals))}
                if n > 1:
                    metric[f"std@{n}"] = float(np.std(vals))
                    preds = var2vals.get("pred")
                    for k in _k_values(n):
                        stats = _bootstrap_stats(vals, preds, k, seed)
                        for name, (mean, std) in stats.items():
                            metric[f"{name}@{k}/mean"], metric[f"{name}@{k}/std"] = mean, std
                for name, value in metric.items():
                    per_prompt[source][var][name].append(value)
    return {source: {var: {name: float(np.mean(v)) for name, v in m.items()} for var, m in by_var.items()}
            for source, by_var in per_prompt.items()}


def metric_names(processed: dict[str, dict[str, dict[str, float]]], core_var: str = "reward") -> dict[str, float]:
    """verl's split: mean/maj/best at the largest N of the core variable -> val-core/, the rest val-aux/."""
    out = {}
    for source, by_var in processed.items():
        for var, metrics in by_var.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in metrics)
            for name, value in metrics.items():
                core = (var == core_var and name.startswith(("mean", "maj", "best")) and f"@{n_max}" in name)
                out[f"{'val-core' if core else 'val-aux'}/{source}/{var}/{name}"] = value
    return out


async def _generate_scored(rollout, reward, examples: list[Example], tokenizer, max_new_tokens: int,
                           n: int, greedy: bool, cfg, temperature: float = 1.0, top_p: float = 1.0,
                           top_k: int = -1, seed: int | None = None, batch_prompts: int = 256):
    """-> (scores [len(examples) * n], NaN where a row could not be scored and
    reward_model.on_failure=drop; response texts), prompt-major."""
    scores, texts = [], []
    for i in range(0, len(examples), batch_prompts):
        prompts = collate(examples[i:i + batch_prompts], tokenizer.pad_token_id)
        kw = {} if greedy else dict(temperature=temperature, top_p=top_p, top_k=top_k,
                                    seed=None if seed is None else seed + i)
        gen = await rollout.generate_sequences(prompts, max_new_tokens=max_new_tokens, n=n, greedy=greedy, **kw)
        scored = await score(reward, gen, tokenizer, cfg)
        settle(scored, n, cfg, where="validation")  # raises with on_failure=fail
        scores.append(scored.scores)
        texts.extend(decode_responses(gen, tokenizer))
    return torch.cat(scores), texts


async def greedy_accuracy(rollout, reward, examples: list[Example], tokenizer, max_new_tokens: int, cfg) -> float:
    """Mean score of one greedy response per prompt (the initial policy's accuracy; rows that
    could not be scored left out)."""
    scores, _ = await _generate_scored(rollout, reward, examples, tokenizer, max_new_tokens, n=1, greedy=True,
                                       cfg=cfg)
    return float(scores.nanmean())


def _scored(scores: torch.Tensor, *per_row: list) -> tuple[list, ...]:
    """The rows that have a score (not NaN): (scores, *per_row) as lists."""
    keep = [i for i, s in enumerate(scores.tolist()) if s == s]
    return ([float(scores[i]) for i in keep], *([values[i] for i in keep] for values in per_row))


def pick_samples(prompts: list[str], texts: list[str], scores: list[float], k: int) -> list[tuple[str, str, float]]:
    """verl's choice of validation generations to log: sorted by prompt, shuffled (seed 42), first k."""
    samples = sorted(zip(prompts, texts, scores), key=lambda x: x[0])
    np.random.RandomState(42).shuffle(samples)
    return [(p, t, float(s)) for p, t, s in samples[:k]]


async def run_validation(roles, examples: list[Example], tokenizer, cfg, step: int,
                         samples: list | None = None) -> dict[str, float]:
    """Greedy and (when val_kwargs.do_sample) sampled validation -> metrics (empty if no examples);
    `samples` (a list) is extended with trainer.log_val_generations (prompt, response, score)."""
    if not examples:
        return {}
    t0 = time.perf_counter()
    vk = cfg.actor_rollout_ref.rollout.val_kwargs
    max_new = cfg.data.max_response_length
    sources = [e.data_source or "unknown" for e in examples]
    greedy, greedy_texts = await _generate_scored(roles.rollout, roles.reward, examples, tokenizer, max_new,
                                                  n=1, greedy=True, cfg=cfg)
    out = {M.VAL_ACCURACY: float(greedy.nanmean())}
    failed = int(greedy.isnan().sum())
    if vk.do_sample:
        scores, texts = await _generate_scored(
            roles.rollout, roles.reward, examples, tokenizer, max_new, n=vk.n, greedy=False, cfg=cfg,
            temperature=vk.temperature, top_p=vk.top_p, top_k=vk.top_k,
            seed=cfg.trainer.seed * 7_919 + 1_000_003 * step)
        failed += int(scores.isnan().sum())
        rewards, rows_sources, uids, preds = _scored(
            scores, [s for s in sources for _ in range(vk.n)], [i for i in range(len(examples)) for _ in range(vk.n)],
            [extract_pred(t) for t in texts])
        out.update(metric_names(process_validation_metrics(
            rows_sources, uids, {"reward": rewards, "pred": preds}, seed=cfg.trainer.seed)))
        for source in sorted(set(sources)):
            picked = [float(g) for g, s in zip(greedy, sources) if s == source and g == g]
            out[f"val-aux/{source}/reward_greedy/mean@1"] = float(np.mean(picked)) if picked else float("nan")
        logged = ([e.prompt_text for e in examples for _ in range(vk.n)], texts, scores.tolist())
    else:
        logged = ([e.prompt_text for e in examples], greedy_texts, greedy.tolist())
        rewards, row_sources, uids, preds = _scored(greedy, sources, list(range(len(examples))),
                                                    [extract_pred(t) for t in greedy_texts])
        out.update(metric_names(process_validation_metrics(row_sources, uids, {"reward": rewards, "pred": preds})))
    if failed:
        out[M.VAL_FAILED_ROWS] = float(failed)
    if samples is not None:
        samples.extend(pick_samples(*logged, cfg.trainer.log_val_generations))
    out[M.TIMING_TESTING] = time.perf_counter() - t0
    return out
