"""Layering rules, checked on the source (ast) and in a fresh interpreter.

- the controller never loads megatron (it only talks to services);
- a service never imports another service (services/<a> -/-> services.<b>);
- the library (tandem/) never imports services or controller;
- only the wire edge imports the generated tandem.v1 messages;
- code imports services/ and controller/ by their installed names (tandem.services, tandem.controller):
  a module imported under two names is two modules (two registries, two loggers' state).
"""
import ast
import fnmatch
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("tandem", "services", "controller")
V1_ALLOWED = ["tandem/data/codec.py", "tandem/rpc/*", "services/*/servicer.py", "tandem/serving/rollout_servicer.py",
              "tandem/serving/lifecycle_servicer.py", "controller/service/servicer.py", "controller/service/client.py",
              "tandem/weights/wire.py", "tandem/weights/client.py", "tandem/weights/source_servicer.py",
              "tandem/weights/streams.py", "controller/clients.py", "services/reward/examples/*", "tandem/v1/*",
              "tandem/reward/conformance.py", "tandem/tools/conformance.py", "tandem/tools/grpc_caller.py",
              "tandem/tools/grpc_episodes.py", "services/tools/examples/*"]


def source_files(top: str) -> list[pathlib.Path]:
    return sorted(p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def module_of(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: pathlib.Path) -> set[str]:
    """Absolute names of everything `path` imports (relative imports resolved; `from a import b`
    counts as a and a.b; importlib.import_module("x") / __import__("x") with a literal too)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in ("import_module", "__import__"):
                out.add(node.args[0].value)
    return {_folder_name(n) for n in out}


def _folder_name(module: str) -> str:
    """tandem.services.x / tandem.controller.x (their installed names) -> services.x / controller.x,
    the folders' own names, which the rules below are written in."""
    for top in ("services", "controller"):
        if under(module, f"tandem.{top}"):
            return module[len("tandem."):]
    return module


def bare_folder_imports(path: pathlib.Path) -> list[str]:
    """Absolute imports of services/controller by the folder names (not tandem.services/...)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else []
        out += [n for n in names if under(n, "services") or under(n, "controller")]
    return out


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_scan_sees_imports():
    """The scanner itself works (else every rule below would pass vacuously)."""
    assert "tandem.v1.actor_pb2" in imported_modules(ROOT / "services/actor/servicer.py")
    assert "services.actor.worker" in imported_modules(ROOT / "services/actor/hybrid.py")
    assert "from tandem.services.actor.worker import" in (ROOT / "services/actor/hybrid.py").read_text()
    assert "controller.launchers" in imported_modules(ROOT / "controller/run.py")
    assert len(source_files("services")) >= 10 and len(source_files("tandem")) >= 30


def megatron_modules_after(imports: str) -> list[str]:
    code = (f"import json, sys\n{imports}\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('megatron', 'transformer_engine'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_controller_does_not_load_megatron():
    loaded = megatron_modules_after("import tandem.controller.run, tandem.controller.step, "
                                    "tandem.controller.launchers.local, tandem.controller.__main__, "
                                    "tandem.controller.service.server, tandem.controller.service.cli")
    assert loaded == [], f"importing the controller loaded {loaded[:10]}"
    # control: the same check does see megatron once something loads it
    assert "megatron.core" in megatron_modules_after("import tandem.controller.run, megatron.core")


def test_code_imports_the_installed_names(tmp_path):
    tops = ("tandem", "services", "controller", "tests", "bench", "deploy")
    offenders = [f"{rel(p)} imports {n}" for top in tops for p in source_files(top) for n in bare_folder_imports(p)]
    assert not offenders, "import tandem.services/tandem.controller, not the folders:\n" + "\n".join(offenders)
    # control: the scan sees a bare import
    probe = tmp_path / "probe.py"
    probe.write_text("from controller.run import Run\nimport services.actor.worker\nimport tandem.controller.run\n")
    assert bare_folder_imports(probe) == ["controller.run", "services.actor.worker"]


def test_services_do_not_import_each_other():
    roles = sorted(p.name for p in (ROOT / "services").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert {"actor", "critic", "reward", "rollout"} <= set(roles)
    offenders = []
    for role in roles:
        for path in source_files(f"services/{role}"):
            for name in imported_modules(path):
                other = name.split(".")[1] if under(name, "services") and name.count(".") >= 1 else None
                if other is not None and other != role:
                    offenders.append(f"{rel(path)} imports {name}")
    assert not offenders, "a service imports another service:\n" + "\n".join(sorted(offenders))


def test_library_does_not_import_services_or_controller():
    offenders = [f"{rel(p)} imports {name}" for p in source_files("tandem") for name in imported_modules(p)
                 if under(name, "services") or under(name, "controller")]
    assert not offenders, "tandem/ imports services/controller:\n" + "\n".join(sorted(offenders))


def test_only_the_wire_edge_imports_tandem_v1():
    offenders = []
    for top in PACKAGES:
        for path in source_files(top):
            r = rel(path)
            if any(fnmatch.fnmatch(r, pat) for pat in V1_ALLOWED):
                continue
            bad = sorted(n for n in imported_modules(path) if under(n, "tandem.v1"))
            if bad:
                offenders.append(f"{r} imports {bad}")
    assert not offenders, "tandem.v1 imported outside the wire edge:\n" + "\n".join(sorted(offenders))


def package_of(module: str) -> str | None:
    """tandem.<package>[.…] -> <package> (a top-level module such as tandem.logging is its own)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "tandem" and len(parts) > 1 else None


def package_graph(files: list[pathlib.Path]) -> dict[str, set[str]]:
    """package -> the other tandem packages its sources import (generated tandem.v1 excluded)."""
    graph: dict[str, set[str]] = {}
    for path in files:
        src = package_of(module_of(path))
        if src is None or src == "v1":
            continue
        for name in imported_modules(path):
            dst = package_of(name)
            if dst in (None, src, "v1"):
                continue
            if (ROOT / "tandem" / dst).is_dir() or (ROOT / "tandem" / f"{dst}.py").is_file():
                graph.setdefault(src, set()).add(dst)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_library_packages():
    graph = package_graph(source_files("tandem"))
    nodes = set(graph).union(*graph.values())  # a bottom package (parallel) imports none: only a target
    assert {"parallel", "serving", "models", "train"} <= nodes, sorted(nodes)
    cycle = find_cycle(graph)
    assert cycle is None, "packages of tandem/ import each other in a cycle: " + " -> ".join(cycle)
    # control: the check finds a cycle once one edge closes it
    closing = {k: set(v) for k, v in graph.items()}
    closing.setdefault("parallel", set()).add("serving")
    assert find_cycle(closing) is not None


def test_nothing_imports_tandem_dist():
    offenders = [f"{rel(p)} imports {name}" for top in PACKAGES + ("tests", "bench") for p in source_files(top)
                 for name in imported_modules(p) if under(name, "tandem.dist")]
    assert not offenders and not (ROOT / "tandem" / "dist").exists(), offenders
