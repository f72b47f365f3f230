"""What `tandem run` checks of a loaded config before anything starts, where the controller runs:
the custom reward function imported once, and no service started beyond loopback without a token.

Deliberately not here: parsing the command line (tandem/config/cli_args.py), loading and validating
the config and the files it names (tandem/config/load.py, paths.py).
"""
from __future__ import annotations

from tandem.config import ConfigError, TandemConfig


def check_before_start(cfg: TandemConfig) -> None:
    """The custom reward function, imported once (its service would find a broken file only after
    every other service had started), and that no service it starts would serve beyond loopback
    without a token (it would refuse to start)."""
    from tandem.reward.function_file import load_function

    c = cfg.custom_reward_function
    if c.path is not None:
        try:
            load_function(c.path, c.name)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    problems = exposure_problems(cfg)
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} config problems:\n" + "\n".join(f"- {p}" for p in problems))


def exposure_problems(cfg: TandemConfig) -> list[str]:
    """A line for each service this run starts on an address beyond loopback (the Ray launcher's:
    its node's) without a token, unless services.insecure."""
    from tandem.controller.launchers.commands import service_of
    from tandem.controller.roles import attach_endpoints, needed_roles
    from tandem.rpc.exposure import exposure_problem

    if cfg.trainer.launcher == "compose":  # compose starts them (deploy/compose.yaml says --insecure)
        return []
    started = sorted({service_of(r) for r, endpoint in attach_endpoints(cfg, needed_roles(cfg)).items()
                      if not endpoint})
    problems = []
    for role in started:
        s = getattr(cfg.services, role)
        host = s.host if cfg.trainer.launcher != "ray" or s.host != "127.0.0.1" else "its Ray node's address"
        why = exposure_problem(host, bool(s.auth.token_file or s.auth.token_env), cfg.services.insecure)
        if why is not None:
            problems.append(f"services.{role}.host: {why}: set services.{role}.auth.token_file (or .token_env), "
                            "or services.insecure=true to serve without one")
    return problems
