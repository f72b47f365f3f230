"""Checks of verl's `profile` keys (torch.profiler traces of chosen ranks and RL steps).

One trace per service process, so each service reads one section: the actor service
`actor_rollout_ref.actor.profile`, a standalone rollout `actor_rollout_ref.rollout.profile`,
the critic `critic.profile`. The reference (always) and a colocated rollout run in the actor's
process: their calls are in the actor's trace, so their sections, when on, must equal it.
"""
from __future__ import annotations

from dataclasses import asdict

from tandem.config.errors import check
from tandem.config.schema import TandemConfig

SECTIONS = {"actor": "actor_rollout_ref.actor.profile", "rollout": "actor_rollout_ref.rollout.profile",
            "critic": "critic.profile"}


def section_of(cfg: TandemConfig, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def check_profile(cfg: TandemConfig) -> None:
    for role, key in SECTIONS.items():
        _check_section(section_of(cfg, key), key, getattr(cfg.services, role).world_size)
    actor = cfg.actor_rollout_ref.actor.profile
    inside = ["actor_rollout_ref.ref.profile"]
    if cfg.actor_rollout_ref.rollout.mode == "colocated":
        inside.append("actor_rollout_ref.rollout.profile")
    for key in inside:
        p = section_of(cfg, key)
        check(not p.use_profile or asdict(p) == asdict(actor), f"{key}.use_profile",
              f"{'the reference' if 'ref' in key else 'a colocated rollout'} runs in the actor service, whose "
              f"trace holds its calls: set actor_rollout_ref.actor.profile.* (this section, when on, must equal it)")


def _check_section(p, key: str, world: int) -> None:
    if not p.use_profile:
        return
    ranks = [0] if p.profile_ranks is None else list(p.profile_ranks)
    check(len(ranks) > 0, f"{key}.profile_ranks", "is empty: no rank would be traced (null traces rank 0)")
    for r in ranks:
        check(0 <= r < world, f"{key}.profile_ranks", f"rank {r} is outside the service's ranks 0..{world - 1}")
    check(p.step_start >= 1, f"{key}.step_start", f"{p.step_start}: RL steps count from 1")
    check(p.step_end > p.step_start, f"{key}.step_end",
          f"{p.step_end} must be > step_start={p.step_start} (steps step_start <= s < step_end are traced)")
    check(p.save_path is None or str(p.save_path).strip() != "", f"{key}.save_path",
          "is empty (null: <run dir>/profile)")
