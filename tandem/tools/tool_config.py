"""verl's tool config (`actor_rollout_ref.rollout.multi_turn.tool_config_path`) -> which ToolService
answers each tool, and the schemas the model is shown.

verl's file, as verl writes it:

    tools:
      - class_name: verl.tools.gsm8k_tool.Gsm8kTool   # verl imports this class; Tandem does not
        config:
          type: native
          endpoint: 127.0.0.1:50090        # Tandem: the HOST:PORT of the ToolService serving it
          timeout_s: 10                    # Tandem, optional: this tool's deadline (retries included)
          auth: {token_file: tools.token}  # Tandem, optional: as services.<role>.auth (or token_env)
          tls: {ca_file: ca.pem}           # Tandem, optional: as services.<role>.tls (enable defaults true)
        tool_schema:
          type: function
          function: {name: calc_gsm8k_reward, description: ..., parameters: {type: object, ...}}

A tool without `config.endpoint` goes to the default endpoint the caller passes (a Tandem key), if
any. Relative file paths are read from the YAML file's folder. Every other `config` key is a
setting of verl's Python class and does nothing here: it comes back as a notice naming it. verl's
MCP tools (`config.type: mcp`) are refused: serve them behind a ToolService. Errors are
ToolConfigError naming the file and the field (`tools[1].tool_schema.function.name: ...`).
`load_tool_schemas` reads the schemas alone: what the prompts show (controller/data.py).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import yaml

from tandem.rpc.auth import read_token
from tandem.rpc.security import PLAINTEXT, EndpointSecurity
from tandem.rpc.tls import TLSFiles
from tandem.tools.schemas import function_problems

_TANDEM_KEYS = {"type", "endpoint", "timeout_s", "auth", "tls"}
_TLS_KEYS = {"enable", "ca_file", "client_cert_file", "client_key_file", "server_name"}


class ToolConfigError(ValueError):
    """A tool config that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class ToolRoute:
    """Where one tool is answered."""

    endpoint: str  # HOST:PORT of its ToolService
    security: EndpointSecurity = PLAINTEXT
    timeout_s: float | None = None  # None: the caller's default


@dataclass(frozen=True)
class ToolConfig:
    schemas: list[dict]  # OpenAI-style function tools, in file order: what the chat template shows
    routes: dict[str, ToolRoute]  # tool name -> where it is answered
    notices: list[str] = field(default_factory=list)  # what each verl entry became, what is not used


def read_yaml(path: str):
    """A config file's YAML document; ToolConfigError naming the file when it cannot be read."""
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except OSError as e:
        raise ToolConfigError(f"{path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ToolConfigError(f"{path}: not valid YAML: {e}") from None


def load_tool_config(path: str, default_endpoint: str | None = None) -> ToolConfig:
    """Read verl's tool-config YAML at `path`; ToolConfigError naming the field on any problem."""
    return parse_tool_config(read_yaml(path), os.path.dirname(os.path.abspath(path)), default_endpoint, source=path)


def load_tool_schemas(path: str) -> list[dict]:
    """Only the tools' schemas (what the prompts show), checked as load_tool_config checks them. No
    route is read: the process that renders prompts need not hold the tools' token or TLS files."""
    return parse_tool_schemas(read_yaml(path), source=path)


def parse_tool_schemas(doc, source: str = "tool config") -> list[dict]:
    """Each entry's tool_schema, in file order; ToolConfigError naming the field."""
    def fail(key: str, why: str):
        raise ToolConfigError(f"{source}: {key}: {why}")

    tools = doc.get("tools") if isinstance(doc, dict) else None
    if not isinstance(tools, list) or not tools:
        fail("tools", "must be a non-empty list of tools (verl's tool-config format)")
    names = []
    for i, entry in enumerate(tools):
        key = f"tools[{i}]"
        if not isinstance(entry, dict):
            fail(key, f"must be a mapping with tool_schema and config, got {type(entry).__name__}")
        problems = function_problems(entry.get("tool_schema"), f"{key}.tool_schema")
        if problems:
            raise ToolConfigError(f"{source}: " + "; ".join(problems))
        name = entry["tool_schema"]["function"]["name"]
        if name in names:
            fail(f"{key}.tool_schema.function.name", f"{name!r} is named by an earlier tool too")
        names.append(name)
    return [entry["tool_schema"] for entry in tools]


def parse_tool_config(doc, base_dir: str, default_endpoint: str | None = None, source: str = "tool config") -> ToolConfig:
    def fail(key: str, why: str):
        raise ToolConfigError(f"{source}: {key}: {why}")

    parse_tool_schemas(doc, source)  # every schema checked before any route is read
    schemas, routes, notices = [], {}, []
    for i, entry in enumerate(doc["tools"]):
        key = f"tools[{i}]"
        name = entry["tool_schema"]["function"]["name"]
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            fail(f"{key}.config", f"must be a mapping, got {type(config).__name__}")
        routes[name] = route_of(config, f"{key}.config", name, base_dir, default_endpoint, fail)
        schemas.append(entry["tool_schema"])
        unused = sorted(set(config) - _TANDEM_KEYS)
        what = f" ({entry['class_name']})" if entry.get("class_name") else ""
        notices.append(f"{key} {name}{what}: called at {routes[name].endpoint}"
                       + (f"; not used (settings of verl's tool class): {', '.join(f'{key}.config.{k}' for k in unused)}"
                          if unused else ""))
    return ToolConfig(schemas, routes, notices)


def route_of(config: dict, key: str, name: str, base_dir: str, default_endpoint, fail,
             service: str = "ToolService") -> ToolRoute:
    """An entry's `config` -> where it is served (endpoint, timeout_s, auth, tls); `fail(key, why)` raises.
    Also read by interaction_config.py: an EnvironmentService is located the same way."""
    if config.get("type", "native") != "native":
        fail(f"{key}.type", f"{config['type']!r}: only native tools; an MCP server (or any other) is "
                            "called through a ToolService in front of it (docs/tools.md)")
    endpoint = config.get("endpoint", default_endpoint)
    if endpoint is None:
        fail(f"{key}.endpoint", f"missing: the HOST:PORT of the {service} that serves {name!r}")
    host, _, port = str(endpoint).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        fail(f"{key}.endpoint", f"{endpoint!r} is not HOST:PORT")
    timeout_s = config.get("timeout_s")
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or not math.isfinite(timeout_s) or timeout_s <= 0):
        fail(f"{key}.timeout_s", f"must be a number of seconds > 0, got {timeout_s!r}")
    return ToolRoute(str(endpoint), _security(config, key, base_dir, fail), timeout_s)


def _security(config: dict, key: str, base_dir: str, fail) -> EndpointSecurity:
    def path(p):
        return p if p is None or os.path.isabs(p) else os.path.join(base_dir, p)

    auth, tls = config.get("auth") or {}, config.get("tls")
    if not isinstance(auth, dict) or set(auth) - {"token_file", "token_env"}:
        fail(f"{key}.auth", f"must be a mapping of token_file or token_env, got {auth!r}")
    try:
        token = read_token(path(auth.get("token_file")), auth.get("token_env"), f"{key}.auth")
    except ValueError as e:
        fail(f"{key}.auth", str(e))
    files = None
    if tls is not None:
        if not isinstance(tls, dict) or set(tls) - _TLS_KEYS:
            fail(f"{key}.tls", f"must be a mapping of {', '.join(sorted(_TLS_KEYS))}, got {tls!r}")
        if tls.get("enable", True):
            files = TLSFiles(ca_file=path(tls.get("ca_file")), client_auth=bool(tls.get("client_cert_file")),
                             client_cert_file=path(tls.get("client_cert_file")),
                             client_key_file=path(tls.get("client_key_file")), server_name=tls.get("server_name"),
                             key_prefix=f"{key}.tls")
            try:
                files.channel_credentials()  # unreadable files fail here, naming their key, not at the first call
            except ValueError as e:
                fail(f"{key}.tls", str(e))
    return EndpointSecurity(files, token)
