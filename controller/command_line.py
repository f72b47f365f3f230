"""What `tandem run` and `tandem submit` take from their command line, checked before anything
starts: `[CONFIG.yaml] [key=value ...]`, one ConfigError line per problem.

A first argument without `=` is the config file when it exists or is named like one (.yaml,
.yml); otherwise it is an override missing its `=`, and said so (read as a path it would fail as
"No such file or directory: .../trainer.total_training_steps"). A config file is checked as YAML
first (file, line and column: tandem/config/yaml_file.py).

Deliberately not here: loading and validating the config (tandem/config/load.py), the checks
of what the config names (`check_before_start`'s callees).
"""
from __future__ import annotations

import os

from tandem.config import ConfigError, TandemConfig
from tandem.config.yaml_file import check_yaml_file

CONFIG_SUFFIXES = (".yaml", ".yml")


def split_args(args: list[str]) -> tuple[str | None, list[str]]:
    """[CONFIG.yaml] key=value ... -> (the config file or None, the overrides); ConfigError listing
    every argument that is neither (one line each) and a config file that is not valid YAML."""
    args = list(args)
    path = None
    if args and "=" not in args[0] and (os.path.isfile(args[0]) or args[0].endswith(CONFIG_SUFFIXES)):
        path = args.pop(0)
    problems = []
    if path is not None and not os.path.isfile(path):
        problems.append(f"config file {path!r} does not exist")
    for i, arg in enumerate(args):
        if "=" not in arg:
            first = i == 0 and path is None
            problems.append(f"{arg!r} is an override missing '=' (key=value)"
                            + (", or a config file that does not exist" if first else ""))
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} problems in the arguments:\n" + "\n".join(f"- {p}" for p in problems))
    if path is not None:
        check_yaml_file(path)
    return path, args


def check_before_start(cfg: TandemConfig) -> None:
    """What the config names, checked here, where the run's controller runs: the files it reads
    (tandem/config/paths.py), the custom reward function, imported once (its service would find
    a broken file only after every other service had started), and that no service it starts
    would serve beyond loopback without a token (it would refuse to start)."""
    from tandem.config.paths import check_paths
    from tandem.reward.function_file import load_function

    check_paths(cfg)
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
