"""verl's interaction config (`actor_rollout_ref.rollout.multi_turn.interaction_config_path`) -> which
EnvironmentService plays each named interaction.

verl's file, as verl writes it, with Tandem's keys in each entry's `config`:

    interaction:
      - name: guess_number                              # a row picks it: extra_info.interaction_kwargs.name
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction   # kept for the notice only
        config:
          endpoint: 127.0.0.1:50090        # Tandem: the HOST:PORT of the EnvironmentService
          timeout_s: 10                    # Tandem, optional: each StartEpisode/Step/CloseEpisode's deadline
          auth: {token_file: env.token}    # Tandem, optional: as services.<role>.auth (or token_env)
          tls: {ca_file: ca.pem}           # Tandem, optional: as services.<role>.tls

Without `name`, the name is verl's: the class name's last part, lower case, less an `Interaction`
suffix. The endpoint, timeout, auth and TLS keys are read as tool_config.py reads a tool's (relative
paths from the YAML file's folder); other `config` keys are settings of verl's Python class and come
back as notices. Errors are ToolConfigError naming the file and the field
(`interaction[0].config.endpoint: ...`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from tandem.tools.tool_config import ToolConfigError, ToolRoute, read_yaml, route_of

_TANDEM_KEYS = {"endpoint", "timeout_s", "auth", "tls"}
_SUFFIX = "Interaction"


@dataclass(frozen=True)
class InteractionConfig:
    routes: dict[str, ToolRoute]  # interaction name -> the EnvironmentService that plays it
    notices: list[str] = field(default_factory=list)


def load_interaction_config(path: str, default_endpoint: str | None = None) -> InteractionConfig:
    """Read verl's interaction-config YAML at `path`; ToolConfigError naming the field on any problem."""
    return parse_interaction_config(read_yaml(path), os.path.dirname(os.path.abspath(path)), default_endpoint,
                                    source=path)


def verl_name(class_name: str) -> str:
    """verl's name for an interaction without one: `...Gsm8kInteraction` -> `gsm8k`."""
    simple = class_name.rsplit(".", 1)[-1]
    return (simple[:-len(_SUFFIX)] if simple.endswith(_SUFFIX) else simple).lower()


def parse_interaction_config(doc, base_dir: str, default_endpoint: str | None = None,
                             source: str = "interaction config") -> InteractionConfig:
    def fail(key: str, why: str):
        raise ToolConfigError(f"{source}: {key}: {why}")

    entries = doc.get("interaction") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        fail("interaction", "must be a non-empty list of interactions (verl's interaction-config format)")
    routes, notices = {}, []
    for i, entry in enumerate(entries):
        key = f"interaction[{i}]"
        if not isinstance(entry, dict):
            fail(key, f"must be a mapping with name, class_name and config, got {type(entry).__name__}")
        name, class_name = entry.get("name"), entry.get("class_name")
        if name is None:
            if not isinstance(class_name, str) or not class_name:
                fail(f"{key}.name", "missing, and no class_name to take verl's name from")
            name = verl_name(class_name)
        if not isinstance(name, str) or not name:
            fail(f"{key}.name", f"must be a non-empty string, got {name!r}")
        if name in routes:
            fail(f"{key}.name", f"{name!r} is named by an earlier interaction too")
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            fail(f"{key}.config", f"must be a mapping, got {type(config).__name__}")
        if "type" in config:  # a tool config's key: an interaction has no MCP form to pick
            fail(f"{key}.config.type", "interactions have no type: config.endpoint names the EnvironmentService")
        routes[name] = route_of(config, f"{key}.config", name, base_dir, default_endpoint, fail,
                                "EnvironmentService")
        unused = sorted(set(config) - _TANDEM_KEYS)
        what = f" ({class_name})" if class_name else ""
        notices.append(f"{key} {name}{what}: played by the EnvironmentService at {routes[name].endpoint}"
                       + (f"; not used (settings of verl's interaction class): "
                          f"{', '.join(f'{key}.config.{k}' for k in unused)}" if unused else ""))
    return InteractionConfig(routes, notices)
