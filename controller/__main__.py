"""`tandem` command line: `tandem run [CONFIG.yaml] [--config-path DIR --config-name NAME] [--dry-run]
[overrides ...]` (tandem/config/cli_args.py); `tandem conformance [--contract tools] HOST:PORT`
(tandem/reward/conformance.py, tandem/tools/conformance.py: does a reward service keep the
RewardService contract, a tool server the ToolService one); the
controller service's commands (`tandem serve | submit | status | logs | cancel | list`,
controller/service/cli.py).

`tandem run` is the one-command path: it runs one job in this process, on services it starts
for that job (or attaches to); with no arguments the built-in default: SFT warm start then
GRPO on the character-level arithmetic task, on CPU, printing held-out accuracy before and
after RL. Deliberately not here: the run itself (controller/run.py); this file parses and prints.
"""
from __future__ import annotations

import argparse
import asyncio
import errno
import json
import sys

SERVICE_COMMANDS = ("serve", "submit", "status", "logs", "cancel", "list")  # controller/service/cli.py


def _parse(argv):
    p = argparse.ArgumentParser(prog="tandem", description="RL post-training of LLMs on gRPC services",
                                epilog="controller service: tandem serve | submit | status | logs | cancel | list "
                                       "(tandem COMMAND -h)")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a whole job locally (starts the services it needs)")
    r.add_argument("args", nargs=argparse.REMAINDER, metavar="[CONFIG.yaml] [--config-path DIR --config-name NAME] "
                   "[--dry-run] [key=value ...]", help="a YAML config or verl's config name, then overrides in "
                   "Hydra's grammar (verl's key names); --dry-run: check everything and print the resolved config")
    from tandem.tools.conformance import add_arguments

    c = sub.add_parser("conformance", help="check a reward service or a tool server against its contract")
    c.add_argument("--contract", choices=("reward", "tools"), default="reward",
                   help="reward: RewardService (the default); tools: ToolService, and EnvironmentService if served")
    add_arguments(c)  # the tools' flags: the reward's and --env-task
    if argv[:1] == ["run"] and not {"-h", "--help"} & set(argv[1:]):
        argv = ["run", "--", *argv[1:]]  # run's options (--config-name, --dry-run) are read by cli_args
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SERVICE_COMMANDS:
        from tandem.controller.service.cli import main as service_main

        return service_main(argv)
    ns = _parse(argv)
    if ns.command == "conformance":
        if ns.contract == "tools":
            from tandem.tools.conformance import main_from_args
        else:
            from tandem.reward.conformance import main_from_args
        return main_from_args(ns)
    from tandem.config import ConfigError, load_config_with_notices, to_yaml
    from tandem.config.cli_args import parse_run_args
    from tandem.config.start_notices import start_notices
    from tandem.controller.command_line import check_before_start
    from tandem.logging import configure_logging
    from tandem.parallel.device import has_cuda

    args = parse_run_args(ns.args[1:] if ns.args[:1] == ["--"] else ns.args)
    try:
        cfg, taken = load_config_with_notices(args.config_file, args.overrides, verl_config=args.verl_config,
                                              files=True, problems=args.problems)
        check_before_start(cfg)
    except (ConfigError, FileNotFoundError) as e:
        print(f"tandem: config error: {e}", file=sys.stderr)
        return 2
    for notice in taken.notices + start_notices(cfg, has_cuda()):  # what verl's keys became, what is chosen
        print(f"tandem: {notice}", file=sys.stderr)
    if args.dry_run:
        print(to_yaml(cfg), end="")
        print("tandem: dry run: the config is valid; nothing was started", file=sys.stderr)
        return 0
    configure_logging(role="controller", level="WARNING")
    from tandem.controller import interrupt
    from tandem.controller.cancel import RunCancelled
    from tandem.controller.launchers.start_failure import ServiceStartFailed
    from tandem.controller.recovery import RunStopped
    from tandem.controller.reward_calls import RewardFailure
    from tandem.controller.run import run
    from tandem.rpc.errors import TandemError

    interrupt.install()  # SIGTERM stops the run as Ctrl-C does, within a deadline
    try:
        summary = asyncio.run(run(cfg))
    except (KeyboardInterrupt, RunCancelled):  # RunCancelled: SIGTERM, the run stopped at its next step
        print("tandem: interrupted; services stopped", file=sys.stderr)
        return 130
    except RunStopped as e:
        print(f"tandem: run stopped: {e}", file=sys.stderr)
        return 1
    except ServiceStartFailed as e:
        print(f"tandem: {e}", file=sys.stderr)
        return 1
    except ConfigError as e:  # found once the data is read (trainer.sft.dev_size)
        print(f"tandem: config error: {e}", file=sys.stderr)
        return 2
    except (RewardFailure, TandemError) as e:  # e.g. RESOURCE_EXHAUSTED: no room for a checkpoint
        print(f"tandem: run failed: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"tandem: run failed: {e}", file=sys.stderr)
        return 1
    keys = ("val_accuracy_init", "sft_steps", "val_accuracy_after_sft", "val_accuracy_final", "rl_gain",
            "wall_time_s")
    print(json.dumps({k: summary.get(k) for k in keys}, indent=2))
    print(f"tandem: held-out greedy accuracy after SFT {summary.get('val_accuracy_after_sft')}, "
          f"after RL {summary.get('val_accuracy_final')}; run directory {summary['run_dir']}")
    return 0


def cli() -> None:
    """The `tandem` console script: main(), then the process ends without the interpreter's teardown
    (tandem/process_exit.py)."""
    from tandem.process_exit import exit_process

    exit_process(main())


if __name__ == "__main__":
    cli()
