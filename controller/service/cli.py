"""`tandem serve | submit | status | logs | cancel | list`: the controller service and its CLI.

`tandem serve` runs the controller service (controller/service/server.py); the others are
its clients (controller/service/client.py) and print rich tables. Both sides take the
controller's TLS and token as flags (controller/service/security_flags.py); `tandem serve`
refuses an address beyond loopback without a token unless given `--insecure`. Deliberately not here:
`tandem run` (controller/__main__.py), which runs one job in-process with its own services.
"""
from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tandem.controller.service.client import DEFAULT_PORT, ENV, ControllerClient, controller_address
from tandem.controller.service.security_flags import (
    add_client_flags,
    add_server_flags,
    client_security,
    server_security,
)
from tandem.rpc.errors import TandemError, Unavailable
from tandem.rpc.exposure import exposure_problem, is_loopback

COMMANDS = ("serve", "submit", "status", "logs", "cancel", "list")
_ROLES = ("actor", "rollout", "critic", "reward")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tandem", description="the Tandem controller service and its CLI")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the controller service: a queue of runs on long-lived services")
    s.add_argument("--state-dir", default="tandem_controller", help="run records (SQLite), service logs")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help="gRPC port (0: any free port, see --port-file)")
    s.add_argument("--port-file", help="write the bound gRPC port here once serving")
    s.add_argument("--http-port", type=int, default=50080, help="status page port (0: any free port)")
    s.add_argument("--service", action="append", default=[], metavar="ROLE=HOST:PORT",
                   help="use this running service for ROLE instead of starting one (repeatable)")
    s.add_argument("--start", default="", metavar="ROLES", help="start these roles' services now, e.g. actor,reward "
                                                                "(others start when a run first needs them)")
    s.add_argument("--keep-services", action="store_true", help="leave started services running at exit")
    add_server_flags(s)
    s.add_argument("--insecure", action="store_true",
                   help="serve on an address beyond loopback (--host) without a bearer token (and the status page "
                        "there too; otherwise it stays on 127.0.0.1)")
    s.add_argument("--allow-dir", action="append", default=[], metavar="DIR",
                   help="runs may name Python files to import (custom_reward_function.path) from this directory "
                        "only (repeatable; none: no run may name one)")
    for name, helptext in (("submit", "queue a run: prints its id"), ("status", "runs, or one run in detail"),
                           ("logs", "a run's log lines"), ("cancel", "cancel a run"), ("list", "every run")):
        c = sub.add_parser(name, help=helptext)
        c.add_argument("--controller", help=f"HOST:PORT of `tandem serve` (default ${ENV} or 127.0.0.1:{DEFAULT_PORT})")
        add_client_flags(c)
        if name == "submit":
            c.add_argument("args", nargs="*", metavar="CONFIG.yaml | key=value")
        elif name in ("status", "logs", "cancel"):
            c.add_argument("run", nargs="?" if name == "status" else None)
        if name == "logs":
            c.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
            c.add_argument("--from-step", type=int, default=0)
            c.add_argument("--metrics", action="store_true", help="also print each step's metrics as JSON")
        if name == "cancel":
            c.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the run to stop (0: don't)")
    return p


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    if ns.command == "serve":
        return _serve(ns)
    try:
        client = ControllerClient(controller_address(ns.controller), security=client_security(ns))
    except ValueError as e:
        print(f"tandem {ns.command}: {e}", file=sys.stderr)
        return 2
    try:
        return {"submit": _submit, "status": _status, "logs": _logs, "cancel": _cancel, "list": _list}[ns.command](
            client, ns)
    except TandemError as e:
        print(f"tandem {ns.command}: {e.code.name}: {e}", file=sys.stderr)
        return 2 if e.code.name == "INVALID_ARGUMENT" else 1
    finally:
        client.close()


def _serve(ns) -> int:
    from tandem.controller.service.server import run_controller

    attach = {}
    for item in ns.service:
        role, _, endpoint = item.partition("=")
        if role not in _ROLES or not endpoint:
            print(f"tandem serve: --service {item!r}: expected ROLE=HOST:PORT with ROLE one of {_ROLES}",
                  file=sys.stderr)
            return 2
        attach[role] = endpoint
    start = tuple(r for r in ns.start.split(",") if r)
    if unknown := [r for r in start if r not in _ROLES]:
        print(f"tandem serve: --start: unknown roles {unknown}; known: {_ROLES}", file=sys.stderr)
        return 2
    try:
        security = server_security(ns)
    except ValueError as e:
        print(f"tandem serve: {e}", file=sys.stderr)
        return 2
    if problem := exposure_problem(ns.host, security.token is not None, ns.insecure):
        print(f"tandem serve: --host {ns.host}: {problem}: give --token-file or --token-env (and --tls-cert/--tls-key),"
              " or pass --insecure to serve without", file=sys.stderr)
        return 2
    try:
        run_controller(ns.state_dir, ns.host, ns.port, ns.http_port, ns.port_file, attach, start, ns.keep_services,
                       security=security, allow_dirs=ns.allow_dir,
                       http_host=ns.host if ns.insecure or is_loopback(ns.host) else "127.0.0.1")
    except KeyboardInterrupt:
        pass
    return 0


def _submit(client: ControllerClient, ns) -> int:
    from tandem.config.cli_args import parse_run_args

    args = parse_run_args(ns.args)
    path = args.config_file
    if args.verl_config or args.dry_run:  # (a verl config name is resolved where `tandem run` runs)
        args.problems.append("tandem submit takes a YAML file and overrides; --config-name of verl's configs and "
                             "--dry-run are tandem run's (try the job with tandem run --dry-run first)")
    try:
        if args.problems:
            raise ValueError("\n".join(args.problems))
        text = open(path).read() if path else ""
    except (ValueError, OSError) as e:
        print(f"tandem submit: config error: {e}", file=sys.stderr)
        return 2
    record = client.submit(text, args.overrides, source=path or "")
    print(record["id"])
    return 0


def _when(t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _runs_table(runs: list[dict]) -> Table:
    table = Table(title="Tandem runs")
    for col in ("run", "state", "step"):  # never cut; the others fold on a narrow terminal
        table.add_column(col, no_wrap=True)
    for col in ("submitted", "finished", "run directory"):
        table.add_column(col, overflow="fold")
    for r in runs:
        state = r["state"] + (" (cancelling)" if r["cancel_requested"] and r["state"] == "running" else "")
        table.add_row(r["id"], state, f"{r['last_step']}/{r['total_steps']}", _when(r["created"]),
                      _when(r["finished"]), escape(r["run_dir"] or "-"))
    return table


def _list(client: ControllerClient, ns) -> int:
    Console().print(_runs_table(client.list()))
    return 0


def _status(client: ControllerClient, ns) -> int:
    if not ns.run:
        return _list(client, ns)
    record, latest = client.get(ns.run)
    console = Console()
    details = Table(title=f"run {record['id']}", show_header=False)
    details.add_column("key")
    details.add_column("value")
    for key in ("state", "experiment", "source", "overrides", "run_dir", "last_step", "total_steps",
                "resumed_from", "error", "service_pids"):
        details.add_row(key, escape(str(record[key])) if record[key] not in ("", None, [], {}) else "-")
    for key in ("created", "started", "finished"):
        details.add_row(key, _when(record[key]))
    if record["summary"]:
        for key in ("val_accuracy_after_sft", "val_accuracy_final", "rl_gain", "wall_time_s"):
            details.add_row(key, str(record["summary"].get(key)))
    console.print(details)
    if latest:
        metrics = Table(title=f"latest metrics (step {record['last_step']})")
        metrics.add_column("metric", no_wrap=True)
        metrics.add_column("value", justify="right")
        for key, value in sorted(latest.items()):
            metrics.add_row(key, f"{value:.6g}")
        console.print(metrics)
    return 0


def _logs(client: ControllerClient, ns) -> int:
    """Print the run's log lines (and metrics with --metrics); -f reconnects after a dropped stream."""
    import json

    after = 0
    while True:
        try:
            for e in client.events(ns.run, ns.from_step, after, follow=ns.follow):
                after = e["seq"]
                if e["kind"] == "log":
                    print(f"[step {e['step']}] {e['body']}", flush=True)
                elif e["kind"] == "state":
                    print(f"[step {e['step']}] state: {e['body']}", flush=True)
                elif ns.metrics:
                    print(json.dumps({"step": e["step"], **e["body"]}), flush=True)
            return 0
        except Unavailable:
            if not ns.follow:
                raise
            time.sleep(1.0)  # the controller restarts: pick up after the last event seen


def _cancel(client: ControllerClient, ns) -> int:
    record = client.cancel(ns.run)
    deadline = time.monotonic() + ns.wait
    while record["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.5)
        record, _ = client.get(ns.run)
    print(f"{record['id']}: {record['state']}" + (" (stopping at its next safe point)"
                                                 if record["state"] == "running" else ""))
    return 0
