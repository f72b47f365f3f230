"""`tandem run`'s arguments, as verl's scripts write them for `python -m verl.trainer.main_ppo`.

    tandem run [CONFIG.yaml] [--config-path DIR] [--config-name NAME] [--dry-run] [overrides ...]

- `--config-path DIR --config-name NAME` (Hydra's, also `-cp` / `-cn`, `=` or a space): DIR/NAME.yaml
  when that file exists (a user's own YAML); else NAME is one of verl's config names
  (VERL_CONFIG_NAMES, e.g. ppo_megatron_trainer), which starts the run from verl's defaults
  (verl_base.py); verl's scripts pass `--config-path=config`, verl's own folder, which is not here;
- a first argument without `=` that is not a deletion (`~key`) is a YAML file (Tandem's form) when
  it exists (one named like one, .yaml or .yml, that does not is said so); otherwise it is an
  override missing its `=`, and said so, as is any later argument without one;
- `--dry-run`: check everything, print the resolved config, start nothing;
- the rest are overrides in Hydra's grammar (overrides.py).

Problems are returned, not raised, so that they join the config's other problems in one report.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from tandem.config.verl_base import VERL_CONFIG_NAMES

YAML = (".yaml", ".yml")
USAGE = "tandem run [CONFIG.yaml] [--config-path DIR --config-name NAME] [--dry-run] [key=value ...]"
# verl's config names Tandem cannot start from, and why
OTHER_VERL_CONFIGS = {"ppo_trainer": "verl's FSDP trainer config; Tandem trains with megatron-core: "
                                     "--config-name=ppo_megatron_trainer"}
_VALUED = {"--config-path": "config_path", "-cp": "config_path", "--config-name": "config_name",
           "-cn": "config_name", "--config-dir": "config_dir", "-cd": "config_dir"}
_NOT_OFFERED = {"--multirun": "sweeps (Hydra's multirun) are not offered: tandem run runs one job",
                "-m": "sweeps (Hydra's multirun) are not offered: tandem run runs one job",
                "--cfg": "use --dry-run to print the resolved config", "-c": "use --dry-run to print the resolved config"}


@dataclass
class RunArgs:
    config_file: str | None = None  # a YAML file (positional, or --config-path/--config-name)
    verl_config: str | None = None  # one of VERL_CONFIG_NAMES: start from verl's defaults
    dry_run: bool = False
    overrides: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _config_file_or_name(args: RunArgs, folders: list[str], name: str) -> None:
    stem = name[:-5] if name.endswith(".yaml") else name[:-4] if name.endswith(".yml") else name
    found = [c for d in folders for c in (os.path.join(d, stem + ".yaml"), os.path.join(d, stem + ".yml"))
             if os.path.isfile(c)]
    if found and args.config_file is not None:
        args.problems.append(f"{args.config_file!r} and --config-name {name} ({found[0]}): give one YAML file")
    elif found:
        args.config_file = found[0]
    elif stem in VERL_CONFIG_NAMES:
        args.verl_config = stem
    elif stem in OTHER_VERL_CONFIGS:
        args.problems.append(f"--config-name {name}: {OTHER_VERL_CONFIGS[stem]}")
    else:
        where = " or ".join(os.path.join(d, stem + ".yaml") for d in folders)
        args.problems.append(f"--config-name {name}: there is no {where}, and it is not one of verl's configs "
                             f"Tandem starts from ({', '.join(VERL_CONFIG_NAMES)})")


def parse_run_args(argv: list[str]) -> RunArgs:
    """`tandem run`'s arguments (without `run`) -> RunArgs; bad options are problems in it."""
    args, values, positional = RunArgs(), {}, 0
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        flag, eq, value = arg.partition("=")
        if flag in _VALUED:
            if not eq:
                value = rest.pop(0) if rest and not rest[0].startswith("-") else None
            if not value:
                args.problems.append(f"{flag} needs a value ({USAGE})")
                continue
            values[_VALUED[flag]] = value
        elif arg == "--dry-run":
            args.dry_run = True
        elif flag in _NOT_OFFERED:
            args.problems.append(f"{flag}: {_NOT_OFFERED[flag]}")
        elif arg.startswith("-"):
            args.problems.append(f"unknown option {arg!r} ({USAGE})")
        else:
            first, positional = positional == 0, positional + 1
            if "=" in arg or arg.startswith("~"):
                args.overrides.append(arg)
            elif first and os.path.isfile(arg):
                args.config_file = arg
            elif first and arg.endswith(YAML):
                args.problems.append(f"config file {arg!r} does not exist")
            else:
                args.problems.append(f"{arg!r} is an override missing '=' (key=value)"
                                     + (", or a config file that does not exist" if first else ""))
    if "config_name" in values:
        folders = [values.get("config_path", "."), *([values["config_dir"]] if "config_dir" in values else [])]
        _config_file_or_name(args, folders, values["config_name"])
    return args
