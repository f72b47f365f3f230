"""How verl's values become Tandem's: the `apply` functions of the rules in verl_keys.py that read a
value (or other keys' values, through `get`) and return the Tandem keys to set; BadValue and `whole`
for values of the wrong kind."""
from __future__ import annotations


class BadValue(ValueError):
    """A value of the wrong kind for its key (not a refusal of what the key asks for)."""


def whole(value, minimum: int = 1) -> int:
    """`value` as a whole number >= minimum; BadValue otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < minimum:
        shown = "empty (an unset shell variable?)" if value == "" else repr(value)
        raise BadValue(f"must be a whole number >= {minimum}, got {shown}")
    return int(value)


def ckpt_to_keep(value, get) -> dict:
    """verl's per-role counts -> the one count of whole checkpoints (the larger; null: every one)."""
    counts = [whole(v) for v in (get("trainer.max_actor_ckpt_to_keep"), get("trainer.max_critic_ckpt_to_keep"))
              if v is not None]
    return {"trainer.max_ckpt_to_keep": max(counts)} if counts else {}


def world_sizes(value, get) -> dict:
    """verl's GPUs (n_gpus_per_node x nnodes) -> the ranks of each model service Tandem starts.
    Every role's rank r uses GPU r, as verl colocates its roles on all GPUs."""
    whole(value)
    try:
        nnodes = whole(get("trainer.nnodes"))
    except ValueError:
        nnodes = 1  # a bad trainer.nnodes is reported on its own
    gpus = whole(get("trainer.n_gpus_per_node")) * nnodes
    out = {"services.actor.world_size": gpus}
    if get("algorithm.adv_estimator") == "gae":
        out["services.critic.world_size"] = gpus
    if get("actor_rollout_ref.rollout.mode") == "standalone":
        out["services.rollout.world_size"] = gpus
    return out


def nnodes(value, get) -> dict:
    """Several nodes: Ray places each service's ranks across them, as verl's workers run on Ray."""
    return {} if whole(value) == 1 else {"trainer.launcher": "ray"}


def rollout_tp(value, get) -> dict:
    """verl's generation TP is its engine's own; a colocated rollout generates on the actor's modules,
    so a TP other than the actor's (or 1) becomes the actor's, and behind a pipeline-parallel actor 1
    (a whole TP=1 copy on every rank, the only colocated way). Standalone: the rollout's own TP."""
    actor_tp = get("actor_rollout_ref.actor.megatron.tensor_model_parallel_size")
    if get("actor_rollout_ref.rollout.mode") == "standalone":
        tp = value
    elif get("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size") not in (1, None):
        tp = 1
    else:
        tp = None if value not in (1, actor_tp) else value
    return {"actor_rollout_ref.rollout.tensor_model_parallel_size": tp}


def logger_list(value, get) -> dict:
    """verl's trainer.logger as one string ("console", or "console,wandb") -> Tandem's list."""
    return {"trainer.logger": [name.strip() for name in value.split(",") if name.strip()]}


def staleness(value, get) -> dict:
    raise ValueError("verl's fully-async staleness_threshold is a fraction of a batch's samples that may come from "
                     "older weights; Tandem's counts weight versions between a batch's generation and its update "
                     "(a whole number: 1 is one step off, 0 on-policy): set async_training.staleness_threshold=1 "
                     "to let generation run one step ahead")


def one_tokenizer(value, get) -> dict:
    """verl's critic tokenizer defaults to the policy's model path, as Tandem's one tokenizer does."""
    policy = get("actor_rollout_ref.model.tokenizer_path") or get("actor_rollout_ref.model.path")
    if value != policy:
        raise ValueError(f"one tokenizer serves every role; it must equal the policy's ({policy!r}): set "
                         "actor_rollout_ref.model.tokenizer_path instead")
    return {}


def rollout_is(value, get) -> dict:
    if value == "token":
        cap = get("algorithm.rollout_correction.rollout_is_threshold")
        if isinstance(cap, bool) or not isinstance(cap, (int, float)):
            raise BadValue(f"token-level truncated importance sampling needs a number as "
                             f"algorithm.rollout_correction.rollout_is_threshold, got {cap!r}")
        return {"actor_rollout_ref.actor.tis_imp_ratio_cap": float(cap)}
    raise ValueError(f"{value!r}: only token-level truncated importance sampling ('token') is offered "
                     "(actor_rollout_ref.actor.tis_imp_ratio_cap)")
